"""Running real Python processes for multi-process store tests, always with a deadline."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ferrodist

PACKAGE_ROOT = str(Path(ferrodist.__file__).resolve().parents[1])


def env() -> dict[str, str]:
    """The current environment with this checkout's ferrodist first on the path."""
    out = dict(os.environ)
    out["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + out.get("PYTHONPATH", "")
    return out


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    """Starts ``python -c code args...``, capturing text output."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(),
    )


def finish(procs: list[subprocess.Popen[str]], timeout: float = 60) -> list[str]:
    """Waits for every process (killing all on timeout) and returns their outputs."""
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, out in zip(procs, outputs):
        assert proc.returncode == 0, out
    return outputs
