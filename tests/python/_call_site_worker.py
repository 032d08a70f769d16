"""One rank of a gloo world that records FSDP, DDP and direct ops and checks every call site the
recorder found against a plain walk up the whole stack (``reference_site``).

``python _call_site_worker.py RANK WORLD INIT_FILE``; prints ``SITES <json>``: per scenario, the
sites recorded and the lines they should name, and any site that differed from the reference.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.utils.checkpoint import checkpoint

import ferrodist as dist
from ferrodist.ddp import DistributedDataParallel
from ferrodist.debug import _call_site, _recorder
from ferrodist.fsdp import FullyShardedDataParallel

_INTERNAL = (
    os.path.dirname(os.path.abspath(dist.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
)


def reference_site(frame) -> str:
    """The first frame outside ferrodist and torch, walked frame by frame, nothing reused."""
    last = frame
    while frame is not None:
        if not frame.f_code.co_filename.startswith(_INTERNAL):
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        last, frame = frame, frame.f_back
    where = os.path.relpath(last.f_code.co_filename, os.path.dirname(_INTERNAL[0][:-1]))
    return f"{where}:{last.f_lineno}"


seen: list[str] = []
mismatches: list[tuple[str, str]] = []


def checked_site(frame=None) -> str:
    """What the recorder calls for each op: the site it found, compared with the reference."""
    frame = frame or sys._getframe(1)
    found = _call_site._walk(frame, len(_call_site._marks.scopes) - 1)
    expected = reference_site(frame)
    if found != expected:
        mismatches.append((found, expected))
    seen.append(found)
    return found


internal_shortcuts = [0]


def checked_internal_site(frame) -> str:
    """The same for ferrodist's own ops (``internal_call_site``), counting those it placed
    without a walk."""
    walks = [0]
    walk = _call_site._walk

    def counted(*args):
        walks[0] += 1
        return walk(*args)

    _call_site._walk = counted
    try:
        found = _call_site.internal_call_site(frame)
    finally:
        _call_site._walk = walk
    internal_shortcuts[0] += walks[0] == 0
    expected = reference_site(frame)
    if found != expected:
        mismatches.append((found, expected))
    seen.append(found)
    return found


def line() -> str:
    """This file's name and the caller's line."""
    return f"{os.path.basename(__file__)}:{sys._getframe(1).f_lineno}"


class Block(torch.nn.Module):
    """A user module inside FSDP: it calls an FSDP unit and issues an op of its own."""

    unit_line = ""
    op_line = ""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, Block.unit_line = self.inner(x), line()
        extra = torch.ones(1)
        _, Block.op_line = dist.all_reduce(extra), line()
        return y


class Checkpointed(torch.nn.Module):
    """A user module that recomputes an FSDP unit in the backward: its forward, and so a scope,
    runs inside the backward pass, below this file's frames."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.run_inner, x, use_reentrant=True)

    inner_line = ""

    def run_inner(self, x: torch.Tensor) -> torch.Tensor:
        y, Checkpointed.inner_line = self.inner(x), line()
        return y


def run(name: str, step, results: dict) -> None:
    del seen[:]
    internal_shortcuts[0] = 0
    lines = step()
    results[name] = {
        "sites": sorted(set(seen)),
        "lines": lines,
        "internal_shortcuts": internal_shortcuts[0],
    }


def main(rank: int, world: int, init: str) -> None:
    _recorder.call_site = checked_site
    _recorder.internal_call_site = checked_internal_site
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    results: dict = {}

    flat = FullyShardedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)]),
        auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
    )

    def fsdp_step() -> dict:
        out, forward = flat(x), line()
        _, backward = out.sum().backward(), line()
        return {"forward": forward, "backward": backward}

    for _ in range(2):
        run("fsdp", fsdp_step, results)

    nested = FullyShardedDataParallel(
        torch.nn.Sequential(Block(), Block()), auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear})
    )

    def nested_step() -> dict:
        out, forward = nested(x), line()
        _, backward = out.sum().backward(), line()
        return {
            "forward": forward,
            "backward": backward,
            "unit": Block.unit_line,
            "op": Block.op_line,
        }

    run("nested", nested_step, results)

    recomputed = FullyShardedDataParallel(
        torch.nn.Sequential(Checkpointed(), torch.nn.Linear(8, 8)),
        auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
        backward_prefetch=None,  # the recomputation gathers its unit itself
    )

    def recomputed_step() -> dict:
        out, forward = recomputed(x.clone().requires_grad_()), line()
        _, backward = out.sum().backward(), line()
        return {"forward": forward, "backward": backward, "inner": Checkpointed.inner_line}

    for _ in range(2):
        run("recomputed", recomputed_step, results)

    ddp = DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)]), bucket_cap_mb=0.0001
    )

    def ddp_step() -> dict:
        out = ddp(x)
        _, backward = out.sum().backward(), line()
        return {"backward": backward}

    for _ in range(2):
        run("ddp", ddp_step, results)

    results["mismatches"] = mismatches
    results["scopes_left"] = len(_call_site._marks.scopes)
    print("SITES " + json.dumps(results), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
