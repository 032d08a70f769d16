"""A world of bench workers as plain subprocesses, one per rank, and rank 0's ``RESULT`` line.

A bench script re-runs itself as each rank (``script --worker RANK WORLD PORT [options]``); its
rank 0 prints ``RESULT <json>`` when done. A world that does not finish by its deadline (a hang)
or in which a rank fails ends the bench with a message that says which.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(
    script: str, world: int, head: list[str], options: list[str], timeout: float = 900
) -> Any:
    """Run ``script --worker *head RANK WORLD PORT *options`` for every rank; the JSON that rank 0
    printed after ``RESULT ``."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, script, "--worker", *head, str(r), str(world), str(port), *options],
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    try:
        out, _ = procs[0].communicate(timeout=timeout)
        for p in procs[1:]:
            p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{script}: a world of {world} did not finish in {timeout} s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        codes = [p.returncode for p in procs]
        raise SystemExit(f"{script}: a world of {world} failed, exit codes {codes}")
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])
