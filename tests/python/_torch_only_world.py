"""A gloo world of real processes that never load ferrodist: torch's side of a parity test.

Why a world apart: torch's gloo sparse all-reduce corrupts the process's heap now and then, and
far more often in a process that has any Rust extension module loaded, ferrodist's or another
package's (README, the DDP table). A parity test that ran torch's side beside ferrodist would
fail on torch's defect; here torch's side runs as a torch user's job runs, and each rank reports
whether any part of ferrodist (a module, or its extension mapped into memory) was loaded, so
the test can assert that it was not.

:func:`torch_only_results` runs ``module.function()`` on every rank of a fresh gloo world, with
``python -c`` processes (nothing of the test process, pytest's plugins included, is imported
there), and returns each rank's result, unpickled. ``function`` returns something picklable.
:func:`world_results` runs the other side the same way, where ferrodist may be loaded.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import warnings
from typing import Any

from _procs import outputs_of, spawn

HERE = os.path.dirname(os.path.abspath(__file__))

_WORKER = """
import gc, os, pickle, sys
sys.path.insert(0, {here!r})
import torch
import torch.distributed as dist

rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(1)
dist.init_process_group(
    "gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank, world_size=world
)
import {module} as scenarios

result = scenarios.{function}()
with open("/proc/self/maps") as maps:
    mapped = sorted({{line.split()[-1] for line in maps if "/ferrodist/_native" in line}})
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "ferrodist")
with open(out, "wb") as f:
    pickle.dump({{"result": result, "ferrodist_modules": loaded, "ferrodist_mapped": mapped}}, f)
gc.collect()
dist.destroy_process_group()
print("DONE", flush=True)
os._exit(0)  # nothing after the report: no group or thread lives into finalization
"""


def torch_only_results(
    module: str, function: str, world: int, timeout: float = 240
) -> dict[int, Any]:
    """``{rank: module.function()}`` from a gloo world of ``world`` processes without
    ferrodist; raises ``AssertionError`` naming the ranks that did not report (with their
    output) or that loaded any part of ferrodist.

    A world in which a rank is killed by a signal (a crash, or the deadline) is run again, up to
    twice, with a warning that says so: with no ferrodist in the process, that is torch's own
    defect (it happens in torch's DDP with no Rust extension loaded: about one loop of 150
    sparse trainings in twelve, README's DDP table), and a retry there hides nothing of
    ferrodist's. An error raised in Python is never retried."""
    for _ in range(2):
        try:
            return world_results(module, function, world, timeout, without_ferrodist=True)
        except _TorchDied as died:
            warnings.warn(f"retrying the torch-only world: {died}", stacklevel=2)
    return world_results(module, function, world, timeout, without_ferrodist=True)


class _TorchDied(AssertionError):
    """A rank of a world without ferrodist was killed by a signal (a test failure, unless
    retried)."""


def world_results(
    module: str, function: str, world: int, timeout: float = 240, *, without_ferrodist: bool
) -> dict[int, Any]:
    """``{rank: module.function()}`` from a fresh gloo world (made by torch's
    ``init_process_group``); ``without_ferrodist``: fail if any rank loaded ferrodist."""
    label = "the torch-only world" if without_ferrodist else "the world"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = _WORKER.format(here=HERE, module=module, function=function)
    with tempfile.TemporaryDirectory(prefix="torch-only-world-") as tmp:
        paths = [os.path.join(tmp, f"rank{r}.pickle") for r in range(world)]
        procs = [spawn(code, str(r), str(world), str(port), paths[r]) for r in range(world)]
        outputs = outputs_of(procs, timeout)
        failed = [
            r for r in range(world) if procs[r].returncode != 0 or not os.path.exists(paths[r])
        ]
        if failed:
            why = f"ranks {failed} of {label} failed: " + "\n".join(
                f"--- rank {r} (exit {procs[r].returncode}):\n{outputs[r][-3000:]}" for r in failed
            )
            killed = any(procs[r].returncode < 0 for r in failed)
            if killed and without_ferrodist:
                raise _TorchDied(why)
            raise AssertionError(why)
        reports = {}
        for rank, path in enumerate(paths):
            with open(path, "rb") as f:
                reports[rank] = pickle.load(f)
    for rank, report in reports.items() if without_ferrodist else ():
        assert not report["ferrodist_modules"] and not report["ferrodist_mapped"], (
            f"rank {rank} of {label} loaded ferrodist: "
            f"{report['ferrodist_modules']} {report['ferrodist_mapped']}"
        )
    return {rank: report["result"] for rank, report in reports.items()}
