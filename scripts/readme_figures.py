"""Measures the README's figures that a script can produce and writes them into README.md.

Hand-copied figures go stale (the README once said a 3 MB wheel, a 4 MB idle server and 447
tests when they were 6.3 MB, 5.8 MiB and 588), so each such figure sits between markers,

    <!-- figures:NAME -->VALUE<!-- /figures -->

and only this script writes VALUE. The figures:

* ``wheel_mb``: the size of the wheel ``pip wheel . --no-deps`` builds from this checkout.
* ``store_idle_rss``: the resident set of ``ferrodist-store`` (the binary on PATH, else
  ``target/release/``) once it listens and has nothing to do, from ``/proc/PID/status``.
* ``tests_passed_V``, ``tests_failed_V``, ``tests_skipped_V`` and ``tests_source_V``: the
  Python suite's counts on torch V and where they came from, read from a pytest run: its
  ``--junitxml`` file or a log ending in pytest's summary line (``--tests V=FILE``), or a run
  this script starts with the interpreter it runs under (``--run-tests``, the whole Python
  suite: about ten minutes).

Usage (``scripts/figures`` sets up the venv and PATH, then runs this file):

    scripts/figures                          # measure wheel and RSS, print, change nothing
    scripts/figures --write                  # ... and write them into README.md
    scripts/figures --only rss               # one figure
    scripts/figures --tests 2.13.0=junit.xml --write

Figures not measured in a run keep their README value.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import date
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARKER = re.compile(r"<!-- figures:([\w.\-]+) -->(.*?)<!-- /figures -->")
VERSION = r"\d+\.\d+\.\d+"
# The value each figure's marker holds, exactly as this script writes it.
FORMATS = {
    "wheel_mb": re.compile(r"\d+\.\d MB"),
    "store_idle_rss": re.compile(r"\d+\.\d MiB"),
    f"tests_passed_{VERSION}": re.compile(r"\d+"),
    f"tests_failed_{VERSION}": re.compile(r"\d+"),
    f"tests_skipped_{VERSION}": re.compile(r"\d+"),
    f"tests_source_{VERSION}": re.compile(r"[^<>|\n]+"),
}
READY_TIMEOUT_S = 30.0


def format_for(name: str) -> Optional[re.Pattern[str]]:
    """The value pattern of figure ``name``, or None for a name this script does not write."""
    for pattern, value in FORMATS.items():
        if re.fullmatch(pattern, name):
            return value
    return None


def read_figures(text: str) -> list[tuple[str, str]]:
    """Every (name, value) between figure markers, in order."""
    return [(m.group(1), m.group(2)) for m in MARKER.finditer(text)]


def write_figures(text: str, figures: dict[str, str]) -> str:
    """``text`` with each named figure's value replaced; every name must have a marker."""
    present = {name for name, _ in read_figures(text)}
    missing = sorted(set(figures) - present)
    if missing:
        raise SystemExit(f"README.md has no marker for {missing}: add one where it belongs")
    for name, value in figures.items():
        pattern = format_for(name)
        if pattern is None or not pattern.fullmatch(value):
            raise ValueError(f"figure {name}: {value!r} is not in its format")
    return MARKER.sub(
        lambda m: (
            f"<!-- figures:{m.group(1)} -->{figures[m.group(1)]}<!-- /figures -->"
            if m.group(1) in figures
            else m.group(0)
        ),
        text,
    )


def store_binary() -> Path:
    found = shutil.which("ferrodist-store")
    binary = Path(found) if found else REPO / "target" / "release" / "ferrodist-store"
    if not binary.is_file():
        raise SystemExit("no ferrodist-store: cargo build --release --bin ferrodist-store")
    return binary


def _vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def idle_rss_kib(binary: Path, samples: int = 10, interval_s: float = 0.05) -> int:
    """The server's RSS in KiB after it printed that it listens, with no client: the largest
    of ``samples`` readings ``interval_s`` apart (threads it starts may still be touching their
    first pages right after the line)."""
    proc = subprocess.Popen(
        [str(binary), "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        if "listening on" not in line:
            raise RuntimeError(f"ferrodist-store did not say it listens: {line!r}")
        readings = []
        for _ in range(samples):
            readings.append(_vm_rss_kib(proc.pid))
            time.sleep(interval_s)
        return max(readings)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wheel_bytes() -> int:
    """Builds the wheel as the README says (``pip wheel . --no-deps``) and returns its size."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-q", "-w", out]
        subprocess.run(command, cwd=REPO, check=True)
        (wheel,) = Path(out).glob("ferrodist-*.whl")
        return wheel.stat().st_size


def counts_from_junit(path: Path) -> dict[str, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "skipped")}
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    passed = total["tests"] - failed - total["skipped"]
    return {"passed": passed, "failed": failed, "skipped": total["skipped"]}


def counts_from_summary(text: str) -> dict[str, int]:
    """The counts in pytest's last summary line (``== 5 passed, 1 skipped in 2.0s ==``)."""
    lines = [ln for ln in text.splitlines() if re.search(r"\b(passed|failed|error)", ln)]
    summary = [ln for ln in lines if re.search(r" in [\d.]+s\b", ln)]
    if not summary:
        raise ValueError("no pytest summary line (like '5 passed, 1 skipped in 2.0s') found")
    words = re.findall(r"(\d+) (passed|failed|skipped|errors?|xpassed)", summary[-1])
    found = {word: int(n) for n, word in words}
    failed = found.get("failed", 0) + found.get("error", 0) + found.get("errors", 0)
    passed = found.get("passed", 0) + found.get("xpassed", 0)
    return {"passed": passed, "failed": failed, "skipped": found.get("skipped", 0)}


def read_counts(path: Path) -> dict[str, int]:
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.lstrip().startswith("<?xml") or text.lstrip().startswith("<testsuite"):
        return counts_from_junit(path)
    return counts_from_summary(text)


def run_suite() -> tuple[str, dict[str, int]]:
    """Runs the Python suite under this interpreter; returns its torch version and counts."""
    import torch

    version = torch.__version__.split("+")[0]
    with tempfile.TemporaryDirectory() as out:
        junit = Path(out) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "tests/python", "-q", "-p", "no:cacheprovider"]
        subprocess.run([*command, f"--junitxml={junit}"], cwd=REPO, check=False)
        return version, counts_from_junit(junit)


def _commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        return head.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def count_figures(version: str, counts: dict[str, int], source: str) -> dict[str, str]:
    kinds = ("passed", "failed", "skipped")
    figures = {f"tests_{kind}_{version}": str(counts[kind]) for kind in kinds}
    figures[f"tests_source_{version}"] = f"{source}, {date.today().isoformat()} at {_commit()}"
    return figures


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="wheel,rss", help="comma list of: wheel, rss")
    parser.add_argument(
        "--tests",
        action="append",
        default=[],
        metavar="VERSION=FILE",
        help="test counts for torch VERSION from a junit XML file or a pytest log",
    )
    parser.add_argument(
        "--run-tests", action="store_true", help="run the Python suite here and count it"
    )
    parser.add_argument("--write", action="store_true", help="write the figures into README.md")
    args = parser.parse_args(argv)

    figures: dict[str, str] = {}
    wanted = {w for w in args.only.split(",") if w}
    unknown = wanted - {"wheel", "rss"}
    if unknown:
        parser.error(f"--only takes wheel and rss, not {sorted(unknown)}")
    if "rss" in wanted:
        figures["store_idle_rss"] = f"{idle_rss_kib(store_binary()) / 1024:.1f} MiB"
    if "wheel" in wanted:
        figures["wheel_mb"] = f"{wheel_bytes() / 1e6:.1f} MB"
    for item in args.tests:
        version, sep, file = item.partition("=")
        if not sep or not re.fullmatch(VERSION, version):
            parser.error(f"--tests takes VERSION=FILE (VERSION like 2.13.0), got {item!r}")
        figures.update(count_figures(version, read_counts(Path(file)), f"from {Path(file).name}"))
    if args.run_tests:
        version, counts = run_suite()
        figures.update(count_figures(version, counts, "scripts/figures --run-tests"))

    for name, value in figures.items():
        print(f"{name}: {value}")
    if args.write:
        text = README.read_text(encoding="utf-8")
        updated = write_figures(text, figures)
        if updated != text:
            README.write_text(updated, encoding="utf-8")
        print(f"wrote {len(figures)} figure(s) into {README.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
