"""The README's script-made figures (scripts/readme_figures.py) are in the script's format, and
the cheap one still holds.

The README once said a 3 MB wheel and a 4 MB idle server long after both had grown, because
nothing checked a figure once it was typed. Now every such figure sits between
``figures`` markers that only the script writes; this test checks that each marker is one the
script knows and holds a value in the format the script writes, measures the idle server's RSS
(a second) and holds it to the README's figure, and checks the script's readers and writer on
a real pytest run and a copy of the README.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import readme_figures  # noqa: E402

# RSS moves with the allocator, the kernel and the page cache: a figure off by more than this
# is stale, not noise (the README said 4 MB long after the server idled above 5 MiB).
RSS_TOLERANCE = 0.25


def _readme_figures() -> dict[str, str]:
    found = readme_figures.read_figures(readme_figures.README.read_text(encoding="utf-8"))
    names = [name for name, _ in found]
    assert len(names) == len(set(names)), f"a figure marked twice: {names}"
    return dict(found)


def test_every_marked_figure_is_in_the_format_the_script_writes() -> None:
    figures = _readme_figures()
    assert {"wheel_mb", "store_idle_rss"} <= set(figures)
    assert any(name.startswith("tests_passed_") for name in figures)
    for name, value in figures.items():
        pattern = readme_figures.format_for(name)
        assert pattern is not None, f"figure {name}: the script writes no such figure"
        assert pattern.fullmatch(value), f"figure {name}: {value!r} is not in the script's format"
    versions = {n.rsplit("_", 1)[1] for n in figures if n.startswith("tests_")}
    for version in versions:
        kinds = {n.split("_")[1] for n in figures if n.endswith("_" + version)}
        assert kinds == {"passed", "failed", "skipped", "source"}, f"torch {version}: {kinds}"


def test_the_idle_server_rss_agrees_with_the_readme() -> None:
    stated = float(_readme_figures()["store_idle_rss"].split()[0])
    measured = readme_figures.idle_rss_kib(readme_figures.store_binary()) / 1024
    assert abs(measured - stated) <= RSS_TOLERANCE * stated, (
        f"ferrodist-store idles in {measured:.1f} MiB, the README says {stated} MiB: "
        "run scripts/figures --only rss --write"
    )


def test_writing_figures_changes_only_their_values() -> None:
    text = readme_figures.README.read_text(encoding="utf-8")
    figures = {"wheel_mb": "12.5 MB", "store_idle_rss": "7.0 MiB"}
    written = readme_figures.write_figures(text, figures)
    assert dict(readme_figures.read_figures(written)).items() >= figures.items()
    assert readme_figures.MARKER.sub("", written) == readme_figures.MARKER.sub("", text)
    with pytest.raises(ValueError):
        readme_figures.write_figures(text, {"wheel_mb": "about 6 MB"})
    with pytest.raises(SystemExit):
        readme_figures.write_figures(text, {"tests_passed_9.9.9": "1"})


def test_counts_read_from_a_real_pytest_run(tmp_path: Path) -> None:
    """Three passes, a failure, two skips and an error in fixture set-up: the junit file and
    the log's summary line both give pytest's own counts."""
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "@pytest.fixture\n"
        "def broken():\n"
        "    raise RuntimeError('set-up fails')\n"
        "@pytest.mark.parametrize('n', [1, 2, 3])\n"
        "def test_pass(n):\n"
        "    assert n\n"
        "def test_fail():\n"
        "    assert False\n"
        "@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_skip(n):\n"
        "    pytest.skip('no')\n"
        "def test_error(broken):\n"
        "    pass\n"
    )
    junit = tmp_path / "junit.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout
    summary = run.stdout.strip().splitlines()[-1]
    reported = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}
    expected = {
        "passed": reported["passed"],
        "failed": reported["failed"] + reported["error"],
        "skipped": reported["skipped"],
    }
    assert expected == {"passed": 3, "failed": 2, "skipped": 2}
    assert readme_figures.counts_from_junit(junit) == expected
    log = tmp_path / "run.log"
    log.write_text(run.stdout)
    assert readme_figures.read_counts(log) == expected
    assert readme_figures.read_counts(junit) == expected
