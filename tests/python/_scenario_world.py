"""A gloo world of real processes that runs named scenarios and reports each one's outcome.

Worker side: :func:`run_scenarios` joins the group and runs every scenario, printing
``RESULT name PASS`` or ``RESULT name FAIL why`` (a failing scenario does not stop the others).
Test side: :func:`scenario_results` spawns the world from a worker module's ``main`` and returns
each scenario's outcome per rank, for the test to assert on.
"""

from __future__ import annotations

import os
import socket
import traceback
from typing import Callable

import torch
import torch.distributed as dist
from _procs import finish, spawn
from _world_end import end_world

HERE = os.path.dirname(os.path.abspath(__file__))


def run_scenarios(
    rank: int, world: int, port: int, scenarios: dict[str, Callable[[], None]]
) -> None:
    """Worker: run each scenario in a gloo group of ``world`` and print its outcome."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        for name, scenario in scenarios.items():
            try:
                scenario()
                print(f"RESULT {name} PASS", flush=True)
            except Exception as e:  # reported to the test, which fails on it
                why = " ".join(traceback.format_exception_only(type(e), e)).strip()
                print(f"RESULT {name} FAIL {why}", flush=True)
            dist.barrier()
    finally:
        end_world()


def scenario_results(module: str, names: list[str], world: int) -> dict[str, list[str]]:
    """Test: run ``module.main(rank, world, port)`` in ``world`` processes; outcomes by name."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        f"import sys; sys.path.insert(0, {HERE!r}); import {module} as w; "
        "w.main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))"
    )
    outputs = finish([spawn(code, str(r), str(world), str(port)) for r in range(world)], 180)
    out: dict[str, list[str]] = {name: [] for name in names}
    for text in outputs:
        for line in text.splitlines():
            if line.startswith("RESULT "):
                _, name, outcome = line.split(" ", 2)
                out[name].append(outcome)
    return out
