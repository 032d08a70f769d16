"""scripts/_setup.sh, which ./scripts/demo, ./scripts/test and ./scripts/bench source: a build
with work to do says what it builds before cargo's lines, a no-op build prints nothing, and a
failed build stops the script (a piped build's status was once swallowed, so a stale extension
from an earlier build ran on).

Most tests run the script with stand-in ``maturin`` and ``cargo`` in a scratch venv's ``bin/``
(which the script puts first on PATH), so they cost no compile; one runs the real tools.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "_setup.sh"
REACHED = "setup finished"

# What maturin develop prints around cargo's lines on a no-op (maturin 1.16).
MATURIN_CHATTER = """\
\u26a0\ufe0f  Warning: `build-backend` in pyproject.toml is not set to `maturin`
\U0001f379 Building a mixed python/rust project
\U0001f40d Found CPython 3.11 at /venv/bin/python
\U0001f517 Found pyo3 bindings with abi3-py3.9 support
\U0001f4e1 Using build options profile, features, bindings from pyproject.toml
"""
FINISHED = "    Finished `extension` profile [optimized] target(s) in 0.15s\n"
BUILT = "\U0001f4e6 Built wheel for abi3 Python \u2265 3.9 to /tmp/x.whl\n"


def _tool(bin_dir: Path, name: str, stderr: str, status: int) -> None:
    (bin_dir / f"{name}.out").write_text(stderr)
    script = bin_dir / name
    script.write_text(f'#!/bin/sh\ncat "{bin_dir}/{name}.out" >&2\nexit {status}\n')
    script.chmod(0o755)


def _scratch_venv(tmp_path: Path) -> Path:
    """A venv the script takes as set up: a python and the stamp of requirements-dev.txt."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    digest = hashlib.sha1((REPO / "requirements-dev.txt").read_bytes()).hexdigest()[:12]
    (venv / f".ferrodist-requirements.{digest}").touch()
    return venv


def _run_setup(venv: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if venv is not None:
        env["FERRODIST_VENV"] = str(venv)
        env["PROTOC"] = "/stand-in/protoc"  # skips the protoc helper, which runs cargo
    return subprocess.run(
        ["bash", "-c", f'source "{SETUP}" && echo "{REACHED}"'],
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture
def extension_built() -> None:
    if not list((REPO / "python" / "ferrodist").glob("_native*.so")):
        pytest.skip("needs the extension built (source scripts/_setup.sh)")


def test_a_failed_extension_build_stops_the_script(tmp_path: Path, extension_built: None) -> None:
    venv = _scratch_venv(tmp_path)
    failure = "\U0001f4a5 maturin failed\n  Caused by: error[E0425]: cannot find value `x`\n"
    _tool(venv / "bin", "maturin", MATURIN_CHATTER + failure, status=1)
    _tool(venv / "bin", "cargo", FINISHED, status=0)
    done = _run_setup(venv)
    # The extension left by an earlier build is still there: only the status tells.
    assert done.returncode != 0
    assert REACHED not in done.stdout
    assert "cannot find value `x`" in done.stdout
    assert "building the extension failed" in done.stderr


def test_a_failed_server_build_stops_the_script(tmp_path: Path, extension_built: None) -> None:
    venv = _scratch_venv(tmp_path)
    _tool(venv / "bin", "maturin", MATURIN_CHATTER + FINISHED + BUILT, status=0)
    _tool(venv / "bin", "cargo", "error: could not compile `ferrodist`\n", status=101)
    done = _run_setup(venv)
    assert done.returncode != 0
    assert REACHED not in done.stdout
    assert "building ferrodist-store failed" in done.stderr


def test_a_build_with_work_says_what_it_builds_first(tmp_path: Path, extension_built: None) -> None:
    venv = _scratch_venv(tmp_path)
    compiling = "   Compiling tokio v1.0.0\n   Compiling ferrodist v0.1.0 (/work/main)\n"
    _tool(venv / "bin", "maturin", MATURIN_CHATTER + compiling + FINISHED + BUILT, status=0)
    _tool(venv / "bin", "cargo", FINISHED, status=0)
    done = _run_setup(venv)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("== building the extension (maturin develop")
    assert lines[1:] == [*compiling.splitlines(), FINISHED.rstrip("\n"), REACHED]


def test_a_stand_in_no_op_build_prints_nothing(tmp_path: Path, extension_built: None) -> None:
    venv = _scratch_venv(tmp_path)
    _tool(venv / "bin", "maturin", MATURIN_CHATTER + FINISHED + BUILT, status=0)
    _tool(venv / "bin", "cargo", FINISHED, status=0)
    done = _run_setup(venv)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == (f"{REACHED}\n", "")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_real_no_op_build_prints_nothing() -> None:
    # The first run builds whatever is stale (nothing, right after ./scripts/test set up).
    first = _run_setup()
    assert first.returncode == 0, first.stdout + first.stderr
    again = _run_setup()
    assert again.returncode == 0, again.stdout + again.stderr
    assert (again.stdout, again.stderr) == (f"{REACHED}\n", "")
