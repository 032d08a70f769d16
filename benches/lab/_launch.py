"""Ranks as processes inside lab hosts: started together, waited for against one deadline.

Each rank runs under ``ip netns exec`` in its own session (so the lab can kill it and what it
spawned by process group, and a terminal's Ctrl-C reaches the lab, which then tears down).
Output goes to a file per rank, not a pipe, so a chatty rank never blocks on a full pipe while
the lab waits on another. When one rank fails, the others get a short grace period (they are
usually stuck in a collective with it) and are then killed, rather than running to the deadline.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import IO

#: How long the other ranks may run on after one has failed.
FAILURE_GRACE_S = 5.0


@dataclasses.dataclass
class RankResult:
    """How one rank ended."""

    rank: int
    host: int
    returncode: int
    output: str
    timed_out: bool = False


def start(
    ns: str, argv: Sequence[str], env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """Starts ``argv`` inside namespace ``ns``; output (stdout and stderr) to a temp file."""
    out = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, *argv],
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    return proc, out


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kills a started process and its session's process group, then reaps it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def wait_all(
    procs: Sequence[subprocess.Popen[bytes]], timeout: float, grace: float = FAILURE_GRACE_S
) -> list[bool]:
    """Waits for every process until ``timeout``; kills the rest early once one fails.

    Returns, per process, whether it was killed because the deadline (or the grace after
    another's failure) ran out; each one's exit code is then in its ``returncode``.
    """
    deadline = time.monotonic() + timeout
    killed = [False] * len(procs)
    while None in [p.poll() for p in procs]:  # a list: every process polled each round
        now = time.monotonic()
        if any(p.returncode not in (None, 0) for p in procs):
            deadline = min(deadline, now + grace)
        if now >= deadline:
            for i, p in enumerate(procs):
                killed[i] = p.poll() is None
                kill_group(p)
            break
        time.sleep(0.05)
    return killed


def read_output(out: IO[bytes]) -> str:
    out.seek(0)
    text = out.read().decode(errors="replace")
    out.close()
    return text
