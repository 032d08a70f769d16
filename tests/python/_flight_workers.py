"""Workers for the flight recorder tests: real gloo worlds that hang, desync, die or train.

Each worker is ``main(scenario, rank, world, port)``; it prints ``KEY value`` lines the test
reads (``REPORT_AFTER`` seconds from entering the stuck op to the watchdog's report, ``ERROR``
the stuck op's error, ``ENTRIES`` the ring as JSON...). Ops that the tests look for by call
site are issued on the lines marked ``# site: NAME``; the test finds those line numbers by
reading this file.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed

import ferrodist as dist
import ferrodist.debug
from ferrodist.debug import _recorder


def _init(rank: int, world: int, port: int, timeout_s: float) -> None:
    torch.set_num_threads(1)
    logging.basicConfig(
        stream=sys.stdout, level=logging.WARNING, format="LOG %(name)s %(message)s", force=True
    )
    timeout = timedelta(seconds=timeout_s)
    prefix = os.environ.get("FLIGHT_TEST_STORE_PREFIX")
    if prefix is not None:
        # A job on a standalone store (``ferrodist-store`` on ``port``), handed in as it is or
        # as a torch PrefixStore (the watchdog's keys then live under the prefix). The token,
        # where the server wants one, comes from the environment.
        store = dist.TCPStore("127.0.0.1", port, world, timeout=timeout)
        if prefix:
            store = torch.distributed.PrefixStore(prefix, store)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        return
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timeout,
    )


def _say(key: str, value: object) -> None:
    text = value if isinstance(value, str) else json.dumps(value)
    print(f"{key} {text}".replace("\n", "\\n"), flush=True)


def _watch_report(started: float) -> None:
    """Print how long after ``started`` the watchdog first kept a report, and the report."""

    def poll() -> None:
        while True:
            report = ferrodist.debug.last_report()
            if report:
                _say("REPORT_AFTER", f"{time.monotonic() - started:.3f}")
                _say("REPORT", report)
                return
            time.sleep(0.02)

    threading.Thread(target=poll, daemon=True).start()


def _warm_up(rank: int) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)  # site: warm
    time.sleep(0.6)  # a heartbeat or two reach the store


def _stuck_all_reduce() -> None:
    started = time.monotonic()
    _watch_report(started)
    t = torch.ones(4)
    try:
        dist.all_reduce(t)  # site: stuck
        _say("RETURNED", "all_reduce")
    except RuntimeError as e:
        _say("ERROR_AFTER", f"{time.monotonic() - started:.3f}")
        _say("ERROR", str(e))
        time.sleep(1.5)  # rank 0 hosts the store: it stays while the others diagnose


def scenario_stopped(rank: int, world: int) -> None:
    """The last rank stops itself (SIGSTOP) before an all_reduce the others wait in."""
    _warm_up(rank)
    if rank == world - 1:
        _say("STOPPING", os.getpid())
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(60)
        return
    _stuck_all_reduce()


def scenario_idle(rank: int, world: int) -> None:
    """A few ops, then idle (heartbeating, nothing pending) until the test removes ``ready*``."""
    _warm_up(rank)
    ready = os.path.join(os.environ["FERRODIST_FLIGHT_DUMP_DIR"], f"ready{rank}")
    with open(ready, "w"):
        pass
    deadline = time.monotonic() + 30
    while os.path.exists(ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()


def _stuck_in(op: Callable[[], object]) -> None:
    """Run ``op``, which hangs until the group's timeout, printing the watchdog's report and the
    error; then stay alive (and heartbeating) until the others have diagnosed too."""
    _watch_report(time.monotonic())
    try:
        op()
        _say("RETURNED", "op")
    except RuntimeError as e:
        _say("ERROR", str(e))
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and not ferrodist.debug.last_report():
        time.sleep(0.05)
    time.sleep(0.5)


def scenario_desync(rank: int, world: int) -> None:
    """Rank 1 broadcasts where the others all-reduce."""
    _warm_up(rank)
    t = torch.ones(4)
    if rank == 1:
        _stuck_in(lambda: dist.broadcast(t, src=1))  # site: desync_broadcast
    else:
        _stuck_in(lambda: dist.all_reduce(t))  # site: desync_all_reduce


def scenario_p2p_deadlock(rank: int, world: int) -> None:
    """Ranks 0 and 1 each receive from the other before sending (a pipeline's deadlock, on
    channels neither has used); rank 2 waits in a barrier."""
    _warm_up(rank)
    t = torch.ones(4)
    if rank == 0:
        _stuck_in(lambda: dist.recv(t, 1))  # site: deadlock_recv_0
    elif rank == 1:
        _stuck_in(lambda: dist.recv(t, 0))  # site: deadlock_recv_1
    else:
        _stuck_in(dist.barrier)


def scenario_killed(rank: int, world: int) -> None:
    """The last rank is SIGKILLed before an all_reduce."""
    _warm_up(rank)
    if rank == world - 1:
        _say("KILLING", os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)
    _stuck_all_reduce()


def scenario_sigusr1(rank: int, world: int) -> None:
    """Rank 1 waits in an all_reduce rank 0 never joins; the test sends SIGUSR1 to both."""
    _warm_up(rank)
    # tell the test this rank is in place (its handler installed, its watchdog running)
    with open(os.path.join(os.environ["FERRODIST_FLIGHT_DUMP_DIR"], f"ready{rank}"), "w"):
        pass
    if rank == 0:
        time.sleep(20)
        return
    _stuck_all_reduce()


def scenario_dump(rank: int, world: int) -> None:
    """A few ops, then ``ferrodist.debug.dump()`` into the directory the test names."""
    t = torch.ones(4)
    for _ in range(5):
        dist.all_reduce(t)  # site: dumped
    dist.broadcast(t, src=0)
    path = ferrodist.debug.dump(os.environ["FLIGHT_TEST_DIR"], reason="manual")
    _say("DUMPED", path)
    dist.barrier()


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(6)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def scenario_ddp_clean(rank: int, world: int) -> None:
    """100 DDP steps (ZeRO optimizer) with uneven step times: no report may appear."""
    from ferrodist.ddp import DistributedDataParallel
    from ferrodist.optim import ZeroRedundancyOptimizer

    torch.manual_seed(0)
    model = DistributedDataParallel(_Net(), bucket_cap_mb=0.001)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01)
    rng = random.Random(rank)
    for _ in range(100):
        time.sleep(rng.choice([0.0, 0.0, 0.01, 0.05, 0.15]))
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        if ferrodist.debug.last_report():
            _say("FALSE_REPORT", ferrodist.debug.last_report())
    dist.barrier()  # every step's works have finished: the ring marks them as it goes on
    entries = ferrodist.debug.recorder().entries()
    ops: dict[str, int] = {}
    for e in entries:
        ops[e["op"]] = ops.get(e["op"], 0) + 1
    _say("OPS", ops)
    _say("PENDING", [e["op"] for e in entries if e["state"] not in ("completed", "failed")])
    _say("STATES", sorted({e["state"] for e in entries}))
    dist.barrier()


def scenario_p2p(rank: int, world: int) -> None:
    """send/recv, isend/irecv and a batch built with ferrodist's isend/irecv, between 0 and 1."""
    t = torch.full((3,), float(rank))
    peer = 1 - rank
    if rank == 0:
        dist.send(t, 1)
        dist.isend(t, 1).wait()
    else:
        dist.recv(t, 0)
        dist.irecv(t, 0).wait()
    ops = [dist.P2POp(dist.isend, t.clone(), peer), dist.P2POp(dist.irecv, t, peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    _say("RESULT", t.tolist())
    dist.barrier()
    _say("ENTRIES", ferrodist.debug.recorder().entries())


def scenario_p2p_any(rank: int, world: int) -> None:
    """Receives from any source on rank 1 (a synchronous one and an asynchronous one), sent by
    ranks 0 and 2, before a receive from a named source. (torch 2.13's ``recv_object_list``
    needs a source.)"""
    t = torch.full((3,), float(rank))
    if rank == 0:
        dist.send(t, 1)
    elif rank == 1:
        _say("SENDER", dist.recv(t))
    dist.barrier()
    if rank == 1:
        work = dist.irecv(t)  # site: any_irecv
    dist.barrier()  # completes while the receive still waits: it must stay pending
    if rank == 1:
        _recorder.sweep()  # as a dump and the watchdog do
        _say("WAITING", [e for e in ferrodist.debug.recorder().entries() if "any" in e["group"]])
    dist.barrier()
    if rank == 2:
        dist.isend(t, 1).wait()
    elif rank == 1:
        work.wait()
    dist.barrier()
    if rank == 0:
        dist.send(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
    dist.barrier()
    _say("ENTRIES", ferrodist.debug.recorder().entries())


def scenario_fsdp(rank: int, world: int) -> None:
    """A few FSDP steps: its all-gathers and reduce-scatters are recorded as FSDP's."""
    from ferrodist.fsdp import FullyShardedDataParallel

    torch.manual_seed(0)
    model = FullyShardedDataParallel(_Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    dist.barrier()
    entries = ferrodist.debug.recorder().entries()
    _say("OPS", sorted({e["op"] for e in entries}))
    _say("PENDING", [e["op"] for e in entries if e["state"] not in ("completed", "failed")])
    del model, opt


SCENARIOS = {
    "stopped": scenario_stopped,
    "idle": scenario_idle,
    "desync": scenario_desync,
    "killed": scenario_killed,
    "p2p_deadlock": scenario_p2p_deadlock,
    "sigusr1": scenario_sigusr1,
    "dump": scenario_dump,
    "ddp_clean": scenario_ddp_clean,
    "p2p": scenario_p2p,
    "p2p_any": scenario_p2p_any,
    "fsdp": scenario_fsdp,
}


def main(scenario: str, rank: int, world: int, port: int, timeout_s: float) -> None:
    _init(rank, world, port, timeout_s)
    SCENARIOS[scenario](rank, world)
    _say("DONE", scenario)
    sys.stdout.flush()
    # A world left hanging on purpose cannot be torn down cleanly: leave at once.
    if scenario in ("stopped", "desync", "killed", "sigusr1", "p2p_deadlock"):
        os._exit(0)
    dist.destroy_process_group()
