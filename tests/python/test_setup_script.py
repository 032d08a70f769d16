"""scripts/_setup.sh, which ./scripts/demo, ./scripts/test and ./scripts/bench source: a build
with work to do says what it builds before cargo's lines, a no-op build prints nothing, and a
failed build stops the script (a piped build's status was once swallowed, so a stale extension
from an earlier build ran on).

An extension that the build did not write stops it too: maturin rewrites the extension on every
successful run, so a file older than the build's start is stale (maturin wrote nothing, or an
earlier build left one under a name python imports first).

Most tests run a copy of the script in a scratch checkout (its ``python/ferrodist/`` holding an
old extension) with stand-in ``maturin`` and ``cargo`` in a scratch venv's ``bin/`` (which the
script puts on PATH ahead of the system's), so they cost no compile and touch nothing of this
checkout; one runs the real tools on this checkout. The checkout's own ``ferrodist-store`` comes
first on PATH, before any a shared venv holds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
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


ABI3 = "python/ferrodist/_native.abi3.so"


def _tool(bin_dir: Path, name: str, stderr: str, status: int, writes: str = "") -> None:
    """A stand-in for ``name`` that prints ``stderr``, writes ``writes`` (a path relative to the
    checkout the script runs it in) and exits with ``status``."""
    (bin_dir / f"{name}.out").write_text(stderr)
    write = f'printf built > "{writes}"\n' if writes else ""
    script = bin_dir / name
    script.write_text(f'#!/bin/sh\ncat "{bin_dir}/{name}.out" >&2\n{write}exit {status}\n')
    script.chmod(0o755)


def _maturin(bin_dir: Path, stderr: str, status: int = 0, writes: str = ABI3) -> None:
    """A stand-in maturin that, like the real one, rewrites the extension when it succeeds."""
    _tool(bin_dir, "maturin", stderr, status, writes if status == 0 else "")


def _scratch_venv(tmp_path: Path) -> Path:
    """A venv the script takes as set up: a python and the stamp of requirements-dev.txt."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    digest = hashlib.sha1((REPO / "requirements-dev.txt").read_bytes()).hexdigest()[:12]
    (venv / f".ferrodist-requirements.{digest}").touch()
    return venv


def _scratch_checkout(tmp_path: Path, *extensions: str) -> Path:
    """A checkout holding a copy of the script and ``extensions`` left by a build a day ago."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "python" / "ferrodist").mkdir(parents=True)
    shutil.copy(SETUP, repo / "scripts" / "_setup.sh")
    shutil.copy(REPO / "requirements-dev.txt", repo / "requirements-dev.txt")
    day_ago = time.time() - 86_400
    for name in extensions or (ABI3,):
        (repo / name).write_text("an earlier build")
        os.utime(repo / name, (day_ago, day_ago))
    return repo


def _run_setup(
    venv: Path | None = None, repo: Path = REPO, then: str = f'echo "{REACHED}"'
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if venv is not None:
        env["FERRODIST_VENV"] = str(venv)
        env["PROTOC"] = "/stand-in/protoc"  # skips the protoc helper, which runs cargo
    return subprocess.run(
        ["bash", "-c", f'source "{repo / "scripts" / "_setup.sh"}" && {then}'],
        env=env,
        cwd=repo,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_a_failed_extension_build_stops_the_script(tmp_path: Path) -> None:
    venv, repo = _scratch_venv(tmp_path), _scratch_checkout(tmp_path)
    failure = "\U0001f4a5 maturin failed\n  Caused by: error[E0425]: cannot find value `x`\n"
    _maturin(venv / "bin", MATURIN_CHATTER + failure, status=1)
    _tool(venv / "bin", "cargo", FINISHED, status=0)
    done = _run_setup(venv, repo)
    # The extension left by an earlier build is still there: only the status tells.
    assert done.returncode != 0
    assert REACHED not in done.stdout
    assert "cannot find value `x`" in done.stdout
    assert "building the extension failed" in done.stderr


def test_a_failed_server_build_stops_the_script(tmp_path: Path) -> None:
    venv, repo = _scratch_venv(tmp_path), _scratch_checkout(tmp_path)
    _maturin(venv / "bin", MATURIN_CHATTER + FINISHED + BUILT)
    _tool(venv / "bin", "cargo", "error: could not compile `ferrodist`\n", status=101)
    done = _run_setup(venv, repo)
    assert done.returncode != 0
    assert REACHED not in done.stdout
    assert "building ferrodist-store failed" in done.stderr


def test_a_build_with_work_says_what_it_builds_first(tmp_path: Path) -> None:
    venv, repo = _scratch_venv(tmp_path), _scratch_checkout(tmp_path)
    compiling = "   Compiling tokio v1.0.0\n   Compiling ferrodist v0.1.0 (/work/main)\n"
    _maturin(venv / "bin", MATURIN_CHATTER + compiling + FINISHED + BUILT)
    _tool(venv / "bin", "cargo", FINISHED, status=0)
    done = _run_setup(venv, repo)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("== building the extension (maturin develop")
    assert lines[1:] == [*compiling.splitlines(), FINISHED.rstrip("\n"), REACHED]


def test_a_stand_in_no_op_build_prints_nothing(tmp_path: Path) -> None:
    venv, repo = _scratch_venv(tmp_path), _scratch_checkout(tmp_path)
    _maturin(venv / "bin", MATURIN_CHATTER + FINISHED + BUILT)
    _tool(venv / "bin", "cargo", FINISHED, status=0)
    done = _run_setup(venv, repo)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == (f"{REACHED}\n", "")
    assert (repo / ABI3).read_text() == "built"


def test_a_build_that_writes_no_extension_stops_the_script(tmp_path: Path) -> None:
    # maturin says it succeeded, but the extension on disk is the one a day-old build left.
    venv, repo = _scratch_venv(tmp_path), _scratch_checkout(tmp_path)
    _maturin(venv / "bin", MATURIN_CHATTER + FINISHED + BUILT, writes="/dev/null")
    _tool(venv / "bin", "cargo", FINISHED, status=0)
    done = _run_setup(venv, repo)
    assert done.returncode != 0
    assert REACHED not in done.stdout
    assert "_native.abi3.so is older than this build: a stale extension" in done.stderr


def test_a_stale_extension_beside_the_fresh_one_stops_the_script(tmp_path: Path) -> None:
    # python imports `_native.cpython-*.so` before `_native.abi3.so`: the stale one would run.
    stale = "python/ferrodist/_native.cpython-311-x86_64-linux-gnu.so"
    venv, repo = _scratch_venv(tmp_path), _scratch_checkout(tmp_path, ABI3, stale)
    _maturin(venv / "bin", MATURIN_CHATTER + FINISHED + BUILT)
    _tool(venv / "bin", "cargo", FINISHED, status=0)
    done = _run_setup(venv, repo)
    assert done.returncode != 0
    assert REACHED not in done.stdout
    assert "_native.cpython-311-x86_64-linux-gnu.so is older than this build" in done.stderr


def test_a_successful_build_with_no_extension_at_all_stops_the_script(tmp_path: Path) -> None:
    venv, repo = _scratch_venv(tmp_path), _scratch_checkout(tmp_path)
    (repo / ABI3).unlink()
    _maturin(venv / "bin", MATURIN_CHATTER + FINISHED + BUILT, writes="/dev/null")
    _tool(venv / "bin", "cargo", FINISHED, status=0)
    done = _run_setup(venv, repo)
    assert done.returncode != 0
    assert "wrote no extension" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_real_no_op_build_prints_nothing() -> None:
    # The first run builds whatever is stale (nothing, right after ./scripts/test set up).
    first = _run_setup()
    assert first.returncode == 0, first.stdout + first.stderr
    again = _run_setup()
    assert again.returncode == 0, again.stdout + again.stderr
    assert (again.stdout, again.stderr) == (f"{REACHED}\n", "")


def test_this_checkouts_server_comes_before_an_installed_one(tmp_path: Path) -> None:
    # A venv shared by several checkouts may hold a ferrodist-store from an older
    # `pip install .`; the tests must run the one this checkout just built.
    venv, repo = _scratch_venv(tmp_path), _scratch_checkout(tmp_path)
    _maturin(venv / "bin", MATURIN_CHATTER + FINISHED + BUILT)
    _tool(venv / "bin", "cargo", FINISHED, status=0)
    _tool(venv / "bin", "ferrodist-store", "", status=1)
    (repo / "target" / "release").mkdir(parents=True)
    _tool(repo / "target" / "release", "ferrodist-store", "", status=0)
    done = _run_setup(venv, repo, then="command -v ferrodist-store")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(repo / "target" / "release" / "ferrodist-store")
