"""A rank of the cut-link test (``test_flight_lab.py``): one per lab host, env:// rendezvous on
host 0 (``MASTER_ADDR`` as the lab sets it; rank 0 hosts ferrodist's store in-process).

Clean all_reduce steps with uneven step times, then the rank tells the test it is done
(``CLEAN``) and waits for the file ``go`` in ``FLIGHT_LAB_DIR``; the test cuts host 2's link
before making it. Then one more all_reduce, which ranks 0 and 1 wait in until the group's
timeout. Prints ``KEY value`` lines (newlines escaped): ``LOGGED`` what the
``ferrodist.debug`` logger logged (after how many seconds in the stuck op), ``FALSE_REPORT`` a
report seen during the clean steps, ``REPORT_AFTER`` / ``REPORT`` when the watchdog first kept
a report and what it said, ``GONE_AFTER`` when its report first named a rank gone,
``ERROR_AFTER`` / ``ERROR`` the stuck op's error. The stuck op is on the line ``# site: cut``.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import threading
import time
from datetime import timedelta

import torch

import ferrodist as dist
import ferrodist.debug


def say(key: str, value: object) -> None:
    print(f"{key} {value}".replace("\n", "\\n"), flush=True)


STARTED: list[float] = []
"""When the rank entered the stuck all_reduce (``time.monotonic()``), once it has."""


class _Logged(logging.Handler):
    """``LOGGED <seconds since the stuck op was entered, or -> <message>``."""

    def emit(self, record: logging.LogRecord) -> None:
        after = f"{time.monotonic() - STARTED[0]:.3f}" if STARTED else "-"
        say("LOGGED", f"{after} {record.getMessage()}")


def main(steps: int, timeout_s: float) -> None:
    torch.set_num_threads(1)
    log = logging.getLogger("ferrodist.debug")
    log.addHandler(_Logged())
    log.setLevel(logging.WARNING)
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = random.Random(rank)
    t = torch.ones(4)
    for _ in range(steps):
        time.sleep(rng.choice([0.0, 0.0, 0.02, 0.1, 0.3]))  # uneven: ranks wait on each other
        t.fill_(1.0)
        dist.all_reduce(t)
        assert t.tolist() == [float(world)] * 4, t
        if ferrodist.debug.last_report():
            say("FALSE_REPORT", ferrodist.debug.last_report())
    time.sleep(0.6)  # the last step's completion reaches the store in a heartbeat or two
    say("CLEAN", steps)
    go = os.path.join(os.environ["FLIGHT_LAB_DIR"], "go")
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    started = time.monotonic()
    STARTED.append(started)

    def watch() -> None:
        first = True
        while True:
            report = ferrodist.debug.last_report() or ""
            if report and first:
                say("REPORT_AFTER", f"{time.monotonic() - started:.3f}")
                say("REPORT", report)
                first = False
            if "is gone" in report:
                say("GONE_AFTER", f"{time.monotonic() - started:.3f}")
                return
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    say("STUCK", rank)
    try:
        dist.all_reduce(t)  # site: cut
        say("RETURNED", t.tolist())
    except RuntimeError as e:
        say("ERROR_AFTER", f"{time.monotonic() - started:.3f}")
        say("ERROR", str(e))
    if rank == 0:
        time.sleep(1.0)  # it hosts the store: stay while rank 1 reads it
    sys.stdout.flush()
    os._exit(0)  # a world with a rank cut off cannot be torn down cleanly


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
