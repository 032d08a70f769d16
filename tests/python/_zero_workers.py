"""Worker functions for the ZeRO tests, run in real processes on gloo (spawned by the tests).

Each worker batches many checks into one process group, since starting a world costs seconds.
Every check compares ferrodist against torch itself, or against a plain (unsharded) optimizer
that torch defines the result of.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _world_end import end_world
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

import ferrodist.optim as fopt

OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "sgd": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 0.01}),
    "adamw": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
}


def init_world(rank: int, world: int, tmp: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/pg-{world}", rank=rank, world_size=world
    )


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    # Uneven sizes, so the sorted-greedy partition is not trivial.
    return nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 5), nn.Tanh(), nn.Linear(5, 3))


def param_groups(model: nn.Module) -> list[dict[str, Any]]:
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": weights}, {"params": biases, "lr": 0.02}]


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 7, generator=g), torch.randn(6, 3, generator=g)


def backward(model: nn.Module, seed: int) -> None:
    x, y = batch(seed)
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()


def assert_state_dicts_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["param_groups"] == b["param_groups"], (a["param_groups"], b["param_groups"])
    assert sorted(a["state"]) == sorted(b["state"]), (sorted(a["state"]), sorted(b["state"]))
    for index, entry in a["state"].items():
        other = b["state"][index]
        assert sorted(entry) == sorted(other)
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, other[key]), (index, key)
            else:
                assert value == other[key], (index, key)


def check_parity_with_torch(rank: int, world: int) -> None:
    """ferrodist == torch, bit for bit: params after steps and the consolidated state dict."""
    to = world - 1  # consolidate somewhere other than rank 0
    for name, (cls, kwargs) in OPTIMIZERS.items():
        for bucket_view in (False, True):
            ours_model, theirs_model = make_model(), make_model()
            ours = fopt.ZeroRedundancyOptimizer(
                param_groups(ours_model), cls, parameters_as_bucket_view=bucket_view, **kwargs
            )
            theirs = TorchZero(
                param_groups(theirs_model), cls, parameters_as_bucket_view=bucket_view, **kwargs
            )
            index = {p: i for i, p in enumerate(ours_model.parameters())}
            theirs_index = {p: i for i, p in enumerate(theirs_model.parameters())}
            assert [
                [[index[p] for p in g["params"]] for g in groups]
                for groups in ours._partition_parameters()
            ] == [
                [[theirs_index[p] for p in g["params"]] for g in groups]
                for groups in theirs._partition_parameters()
            ]
            for step in range(3):
                for model, opt in ((ours_model, ours), (theirs_model, theirs)):
                    backward(model, seed=100 * rank + step)  # rank-local gradients
                    opt.step()
            for p, q in zip(ours_model.parameters(), theirs_model.parameters()):
                assert torch.equal(p, q), (name, bucket_view, world)
            ours.consolidate_state_dict(to=to)
            theirs.consolidate_state_dict(to=to)
            if rank == to:
                assert_state_dicts_equal(ours.state_dict(), theirs.state_dict())
            else:
                try:
                    ours.state_dict()
                except RuntimeError as err:
                    assert f"consolidate_state_dict(to={rank})" in str(err)
                else:
                    raise AssertionError("state_dict() without consolidation must raise")


def check_add_param_group_parity(rank: int, world: int) -> None:
    ours_model, theirs_model = make_model(), make_model()
    ours_params, theirs_params = list(ours_model.parameters()), list(theirs_model.parameters())
    ours = fopt.ZeroRedundancyOptimizer(ours_params[:4], torch.optim.Adam, lr=0.01)
    theirs = TorchZero(theirs_params[:4], torch.optim.Adam, lr=0.01)
    ours.add_param_group({"params": ours_params[4:], "lr": 0.03})
    theirs.add_param_group({"params": theirs_params[4:], "lr": 0.03})
    assert [len(g["params"]) for g in ours.optim.param_groups] == [
        len(g["params"]) for g in theirs.optim.param_groups
    ]
    for step in range(2):
        for model, opt in ((ours_model, ours), (theirs_model, theirs)):
            backward(model, seed=100 * rank + step)
            opt.step()
    for p, q in zip(ours_model.parameters(), theirs_model.parameters()):
        assert torch.equal(p, q)


def check_subgroup(rank: int, world: int) -> None:
    """ZeRO over a group that excludes global rank 0: group ranks != global ranks."""
    members = list(range(1, world))
    group = dist.new_group(members)  # collective over the whole world
    if rank not in members:
        return
    cls, kwargs = OPTIMIZERS["adam"]
    ours_model, theirs_model = make_model(), make_model()
    ours = fopt.ZeroRedundancyOptimizer(
        param_groups(ours_model), cls, process_group=group, **kwargs
    )
    theirs = TorchZero(param_groups(theirs_model), cls, process_group=group, **kwargs)
    for step in range(2):
        for model, opt in ((ours_model, ours), (theirs_model, theirs)):
            backward(model, seed=100 * rank + step)
            opt.step()
    for p, q in zip(ours_model.parameters(), theirs_model.parameters()):
        assert torch.equal(p, q)
    ours.consolidate_state_dict(to=0)  # group rank 0 = global rank 1
    theirs.consolidate_state_dict(to=0)
    if rank == members[0]:
        assert_state_dicts_equal(ours.state_dict(), theirs.state_dict())


def reference_run(name: str, steps: int) -> nn.Module:
    """The unsharded optimizer on the same data: what resharded ZeRO must reproduce."""
    cls, kwargs = OPTIMIZERS[name]
    model = make_model()
    opt = cls(param_groups(model), **kwargs)
    for step in range(steps):
        backward(model, seed=step)
        opt.step()
    return model


RESHARD_STEPS = 2  # steps per world in the resharding chain


def check_resharding(rank: int, world: int, tmp: str, load_from: int | None) -> None:
    """Continue training from a checkpoint consolidated at world size ``load_from``, then save
    one of our own; the trajectory must equal the unsharded optimizer's, bit for bit."""
    for name in ("sgd", "adam"):
        cls, kwargs = OPTIMIZERS[name]
        for bucket_view in (False, True):
            tag = f"{name}-{int(bucket_view)}"
            model = make_model()
            zero = fopt.ZeroRedundancyOptimizer(
                param_groups(model), cls, parameters_as_bucket_view=bucket_view, **kwargs
            )
            done = 0
            if load_from is not None:
                ckpt = torch.load(Path(tmp) / f"ckpt-{tag}-{load_from}.pt", weights_only=False)
                with torch.no_grad():
                    for p, saved in zip(model.parameters(), ckpt["model"]):
                        p.copy_(saved)
                before = repr(ckpt["optim"])
                zero.load_state_dict(ckpt["optim"])
                done = ckpt["steps"]
            for step in range(done, done + RESHARD_STEPS):
                backward(model, seed=step)  # same data on every rank: world-size independent
                zero.step()
            if load_from is not None:
                # torch overwrites non-owned entries with None and keeps training the loaded
                # tensors in place; the checkpoint must come out of ours untouched.
                assert repr(ckpt["optim"]) == before, "load_state_dict must not edit its input"
            reference = reference_run(name, done + RESHARD_STEPS)
            for p, q in zip(model.parameters(), reference.parameters()):
                assert torch.equal(p, q), (tag, world, load_from)
            zero.consolidate_state_dict(to=0)
            if rank == 0:
                state = zero.state_dict()
                torch.save(
                    {
                        "model": [p.detach().clone() for p in model.parameters()],
                        "optim": state,
                        "steps": done + RESHARD_STEPS,
                    },
                    Path(tmp) / f"ckpt-{tag}-{world}.pt",
                )
            dist.barrier()


def run_world(rank: int, world: int, tmp: str, load_from: int | None) -> None:
    init_world(rank, world, tmp)
    try:
        check_parity_with_torch(rank, world)
        check_add_param_group_parity(rank, world)
        check_subgroup(rank, world)
        check_resharding(rank, world, tmp, load_from)
        from _zero_ddp_workers import run_ddp_checks

        run_ddp_checks(rank, world)
    finally:
        end_world()
