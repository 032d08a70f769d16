"""A destroyed process group really ends, and ends before the interpreter does
(``ferrodist._group_release``): torch modules imported while it lived hold it in default
arguments, and DDP modules and optimizers hold it from reference cycles; either kept its gloo
threads running into interpreter exit, where one that still had to free a tensor aborted the
process ("terminate called without an active exception").

Each case runs in a fresh process, since what matters is import order and interpreter exit."""

from __future__ import annotations

import socket

from _procs import finish, spawn

_LATE_IMPORTS = """
import sys, weakref
import torch
import ferrodist

dist = ferrodist if sys.argv[2] == "ferrodist" else torch.distributed
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1)
assert "torch.distributed.nn.functional" not in sys.modules
# torch binds group.WORLD as a default argument in these modules when they are imported:
import torch.distributed.nn.functional as F
import torch.distributed.optim.zero_redundancy_optimizer as Z
world = dist.group.WORLD
f_default, z_default = F.all_reduce.__defaults__[-1], Z._broadcast_object.__defaults__[0]
print("pinned", f_default is world, z_default is world)
del f_default, z_default
ref = weakref.ref(world)
del world
dist.destroy_process_group()
f_default, z_default = F.all_reduce.__defaults__[-1], Z._broadcast_object.__defaults__[0]
print("released", f_default is None, z_default is None)
del f_default, z_default
print("group ended", ref() is None)
if sys.argv[2] == "ferrodist":
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[3]}", rank=0,
                            world_size=1)
    print("new group sums", F.all_reduce(torch.full((2,), 3.0)).tolist())
    dist.destroy_process_group()
"""


def _free_ports(n: int) -> list[str]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [str(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def test_destroy_releases_the_group_that_late_imported_torch_modules_hold():
    ours, theirs = finish(
        [
            spawn(_LATE_IMPORTS, *_free_ports(1), "ferrodist", *_free_ports(1)),
            spawn(_LATE_IMPORTS, *_free_ports(1), "torch"),
        ],
        120,
    )
    # torch's own destroy_process_group leaves the group in those defaults, alive for good
    assert "pinned True True" in theirs and "released False False" in theirs, theirs
    assert "group ended False" in theirs, theirs
    # ferrodist's puts back None (the defaults of a module imported before any group), so the
    # group ends now, and the functions use whatever group is the default later
    assert "pinned True True" in ours and "released True True" in ours, ours
    assert "group ended True" in ours, ours
    assert "new group sums [3.0, 3.0]" in ours, ours


_HELD_BY_GARBAGE = """
import atexit, os, sys, weakref

probe = {}

def gloo_workers():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            pass
    return names.count("pt_gloo_runloop")

def report():
    # registered before ferrodist is imported, so it runs after ferrodist's atexit handler:
    # the last Python code before the interpreter finalizes
    print("at exit: group alive", probe["group"]() is not None, flush=True)
    print("at exit: gloo workers", gloo_workers(), flush=True)

atexit.register(report)

import gc, importlib
import torch
import ferrodist as dist
from ferrodist.nn import DistributedDataParallel

gc.disable()  # no collection but the ones at exit

def train():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}",
                            rank=int(sys.argv[2]), world_size=2)
    ddp = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ddp(torch.randn(3, 4)).sum().backward()
    opt.step()
    importlib.import_module("torch.distributed.nn.functional")  # binds the group as a default
    cycle = [ddp, opt]
    cycle.append(cycle)  # garbage that only a collection frees, whatever DDP itself does
    probe["group"] = weakref.ref(dist.group.WORLD)
    print("gloo workers while training", gloo_workers(), flush=True)
    dist.barrier()
    dist.destroy_process_group()

train()
"""


def test_a_group_held_by_garbage_ends_before_the_interpreter_exits():
    port = _free_ports(1)[0]
    outputs = finish([spawn(_HELD_BY_GARBAGE, port, str(rank)) for rank in range(2)], 120)
    for out in outputs:
        assert "at exit: group alive False" in out, out
        # torch names gloo's worker threads from 2.5 on; where it does, none is left running
        named = "gloo workers while training 0" not in out
        if named:
            assert "at exit: gloo workers 0" in out, out
        assert "terminate called" not in out, out
