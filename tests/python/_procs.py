"""Running real Python processes for multi-process store tests, always with a deadline; and
Ctrl-C sent to this one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator

import ferrodist

PACKAGE_ROOT = str(Path(ferrodist.__file__).resolve().parents[1])


def env() -> dict[str, str]:
    """The current environment with this checkout's ferrodist first on the path."""
    out = dict(os.environ)
    out["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + out.get("PYTHONPATH", "")
    return out


def default_sigint() -> None:
    """In a child before exec: SIGINT back to its default disposition. A runner started in
    the background of a non-interactive shell (``cmd &``) ignores SIGINT, and an ignored
    signal stays ignored across exec; the Ctrl-C tests must see what a user's process sees."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def ctrl_c_after(seconds: float) -> Iterator[None]:
    """Python's own Ctrl-C handler, as a user's process has it (a background runner ignores
    SIGINT, and its children inherit that), and SIGINT sent to this process after ``seconds``."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGINT, previous)


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    """Starts ``python -c code args...``, capturing text output (SIGINT at its default)."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(),
        preexec_fn=default_sigint,
    )


def outputs_of(procs: list[subprocess.Popen[str]], timeout: float = 60) -> list[str]:
    """Every process's output; any still running (or stopped) at the deadline, ``timeout``
    seconds from now for all of them together, is killed and its output so far kept."""
    outputs = []
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


def finish(procs: list[subprocess.Popen[str]], timeout: float = 60) -> list[str]:
    """Every process's output (see :func:`outputs_of`), each having exited with 0."""
    outputs = outputs_of(procs, timeout)
    for proc, out in zip(procs, outputs):
        assert proc.returncode == 0, out
    return outputs
