"""Worker functions for the DTensor state-dict tests (spawned gloo worlds, CPU device meshes).

torch's FSDP built with the same ``device_mesh`` is the reference: both train the same model
from the same batches, then their SHARDED model and optimizer state dicts must hold DTensors
with the same placements, shapes, strides and local tensors, load crosswise, and refuse LOCAL
alike. The checkpoint round trip writes DTensor dicts with ``torch.distributed.checkpoint`` at
world 4 (both FSDPs) and loads them at worlds 4 and 2 into both, training on bitwise alike.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from _fsdp_optim_sharded_workers import (
    assert_same_losses,
    full_optim,
    names_sorted,
    train,
    trainable,
)
from _fsdp_workers import CPU, OPTIMIZERS, Block, assert_same_local_state, init_world, make_model
from _world_end import end_world
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP
from torch.distributed.fsdp import ShardingStrategy, StateDictType
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.tensor import DTensor, Replicate, Shard

from ferrodist.fsdp import FullyShardedDataParallel as FerroFSDP

SHARDED = StateDictType.SHARDED_STATE_DICT
LOCAL = StateDictType.LOCAL_STATE_DICT
FULL = StateDictType.FULL_STATE_DICT


def mesh_for(strategy: str, world: int) -> Any:
    """A 1-D mesh over the world, or for the hybrid strategies (replicate, shard) = (w/2, 2)."""
    if "HYBRID" in strategy:
        return init_device_mesh("cpu", (world // 2, 2))
    return init_device_mesh("cpu", (world,))


def wrap(cls: Any, strategy: str, orig: bool, mesh: Any, seed: int = 0) -> Any:
    return cls(
        make_model(seed),
        sharding_strategy=ShardingStrategy[strategy],
        device_mesh=mesh,
        use_orig_params=orig,
        device_id=CPU,
        auto_wrap_policy=ModuleWrapPolicy({Block, nn.Linear}),
    )


def assert_same(a: Any, b: Any, tag: str) -> None:
    """Same types and keys in order; DTensors with equal placements, mesh, global shape and
    stride and bitwise-equal local tensors; other tensors bitwise equal."""
    assert type(a) is type(b), (tag, type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b), (tag, list(a), list(b))
        for key in a:
            assert_same(a[key], b[key], f"{tag}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), tag
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{tag}[{i}]")
    elif isinstance(a, DTensor):
        assert a.placements == b.placements, (tag, a.placements, b.placements)
        assert a.device_mesh == b.device_mesh, tag
        assert a.shape == b.shape and a.stride() == b.stride(), (tag, a.shape, b.shape)
        x, y = a.to_local(), b.to_local()
        assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride(), (tag, x, y)
        assert torch.equal(x, y), (tag, x, y)
    elif isinstance(a, ShardedTensor):
        assert_same_local_state({"v": a}, {"v": b}, tag)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (tag, a, b)
    else:
        assert a == b, (tag, a, b)


def expected_placements(strategy: str) -> tuple[Any, ...]:
    return (Replicate(), Shard(0)) if "HYBRID" in strategy else (Shard(0),)


def check_state_dicts(rank: int, world: int) -> None:
    """SHARDED model and optimizer state dicts hold torch's DTensors; each FSDP loads the
    other's; LOCAL with a device mesh raises torch's RuntimeError."""
    configs = [("FULL_SHARD", False, "adam"), ("SHARD_GRAD_OP", True, "sgd")]
    if world == 4:
        configs += [("HYBRID_SHARD", False, "adam"), ("_HYBRID_SHARD_ZERO2", True, "sgd")]
    for strategy, orig, optim_name in configs:
        tag = f"{strategy} orig={orig} {optim_name} w{world}"
        mesh = mesh_for(strategy, world)
        theirs, ours = wrap(TorchFSDP, strategy, orig, mesh), wrap(FerroFSDP, strategy, orig, mesh)
        t_opt = OPTIMIZERS[optim_name](theirs.parameters())
        o_opt = OPTIMIZERS[optim_name](ours.parameters())
        assert_same_losses(
            train(theirs, t_opt, rank, range(2)), train(ours, o_opt, rank, range(2)), tag
        )
        with TorchFSDP.state_dict_type(theirs, SHARDED), FerroFSDP.state_dict_type(ours, SHARDED):
            t_sd, o_sd = theirs.state_dict(), ours.state_dict()
            assert_same(t_sd, o_sd, tag + " model")
            params = [k for k, v in o_sd.items() if isinstance(v, DTensor)]
            assert len(params) == 14, (tag, params)  # every parameter, no buffer
            assert all(o_sd[k].placements == expected_placements(strategy) for k in params), tag
            # Both turned ``_use_dtensor`` on in the model and optimizer configs.
            settings = FerroFSDP.get_state_dict_type(ours)
            assert settings == TorchFSDP.get_state_dict_type(theirs), (tag, settings)
            assert settings.state_dict_config._use_dtensor, tag
            assert settings.optim_state_dict_config._use_dtensor, tag
            t_osd = TorchFSDP.optim_state_dict(theirs, t_opt)
            o_osd = FerroFSDP.optim_state_dict(ours, o_opt)
            assert_same(t_osd, o_osd, tag + " optim")
            assert any(isinstance(v, DTensor) for e in o_osd["state"].values() for v in e.values())
            # Crosswise: fresh models take the other FSDP's dicts.
            fresh_t = wrap(TorchFSDP, strategy, orig, mesh, seed=5)
            fresh_o = wrap(FerroFSDP, strategy, orig, mesh, seed=6)
            with TorchFSDP.state_dict_type(fresh_t, SHARDED):
                fresh_t.load_state_dict(o_sd)
                assert_same(t_sd, fresh_t.state_dict(), tag + " torch <- ours")
            with FerroFSDP.state_dict_type(fresh_o, SHARDED):
                fresh_o.load_state_dict(t_sd)
                assert_same(o_sd, fresh_o.state_dict(), tag + " ours <- torch")
            t_load = TorchFSDP.optim_state_dict_to_load(theirs, t_opt, o_osd)
            o_load = FerroFSDP.optim_state_dict_to_load(ours, o_opt, t_osd)
        assert_same(names_sorted(t_load), names_sorted(o_load), tag + " to_load")
        assert_same(names_sorted(o_load), names_sorted(o_opt.state_dict()), tag + " own")
        fresh_t_opt = OPTIMIZERS[optim_name](fresh_t.parameters())
        fresh_o_opt = OPTIMIZERS[optim_name](fresh_o.parameters())
        fresh_t_opt.load_state_dict(t_load)
        fresh_o_opt.load_state_dict(o_load)
        assert_same_losses(
            train(fresh_t, fresh_t_opt, rank, range(2, 4)),
            train(fresh_o, fresh_o_opt, rank, range(2, 4)),
            tag + " after load",
        )
        check_local_refused(theirs, ours, t_opt, o_opt, tag)
        check_deprecated(theirs, ours, t_opt, o_opt, tag)
    dist.barrier()


def check_deprecated(theirs: Any, ours: Any, t_opt: Any, o_opt: Any, tag: str) -> None:
    """The deprecated ``sharded_optim_state_dict`` reads each unit's current optimizer config
    without marking it: ShardedTensors under the default FULL settings, DTensors once
    ``get_state_dict_type`` has turned ``_use_dtensor`` on in that same config object."""
    for marked in (False, True):
        if marked:
            TorchFSDP.get_state_dict_type(theirs)
            FerroFSDP.get_state_dict_type(ours)
        t_osd = TorchFSDP.sharded_optim_state_dict(theirs, t_opt)
        o_osd = FerroFSDP.sharded_optim_state_dict(ours, o_opt)
        assert_same(t_osd, o_osd, f"{tag} deprecated marked={marked}")
        kind = DTensor if marked else ShardedTensor
        assert any(isinstance(v, kind) for e in o_osd["state"].values() for v in e.values()), tag


def check_local_refused(theirs: Any, ours: Any, t_opt: Any, o_opt: Any, tag: str) -> None:
    """LOCAL_STATE_DICT with a device mesh: the same RuntimeError from both FSDPs, for the
    model state dict, its loading and the optimizer state dict."""
    with TorchFSDP.state_dict_type(theirs, LOCAL), FerroFSDP.state_dict_type(ours, LOCAL):
        calls = [
            (lambda m, c, o: m.state_dict()),
            (lambda m, c, o: m.load_state_dict({})),
            (lambda m, c, o: c.optim_state_dict(m, o)),
        ]
        for i, call in enumerate(calls):
            errors = []
            for model, cls, optim in ((theirs, TorchFSDP, t_opt), (ours, FerroFSDP, o_opt)):
                try:
                    call(model, cls, optim)
                    errors.append("")
                except RuntimeError as err:
                    errors.append(str(err))
            assert errors[0] and errors[0] == errors[1], (tag, i, errors)
            assert "DeviceMesh is not compatible with LOCAL_STATE_DICT" in errors[0], errors


# (strategy, use_orig_params, optimizer) saved at world 4, loaded at 4 and 2.
ROUND_TRIP = [("FULL_SHARD", False, "adam"), ("HYBRID_SHARD", True, "sgd")]


def prime(optim: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state tensors without moving a parameter (a step on zero
    gradients), so a SHARDED optimizer state dict can serve as the template dcp loads into."""
    for group in optim.param_groups:
        for param in group["params"]:
            param.grad = torch.zeros_like(param)
    optim.step()
    optim.zero_grad()


def save(model: Any, optim: Any, cls: Any, path: str) -> None:
    import torch.distributed.checkpoint as dcp

    with cls.state_dict_type(model, SHARDED):
        state = {"model": model.state_dict(), "optim": cls.optim_state_dict(model, optim)}
        dcp.save(state, checkpoint_id=path)


def load(model: Any, optim: Any, cls: Any, path: str) -> None:
    """dcp loads in place into this model's DTensor dicts (the optimizer primed first), then
    ``load_state_dict`` and ``optim_state_dict_to_load`` take them."""
    import torch.distributed.checkpoint as dcp

    prime(optim)
    with cls.state_dict_type(model, SHARDED):
        state = {"model": model.state_dict(), "optim": cls.optim_state_dict(model, optim)}
        assert any(isinstance(v, DTensor) for v in state["model"].values())
        dcp.load(state, checkpoint_id=path)
        model.load_state_dict(state["model"])
        optim.load_state_dict(cls.optim_state_dict_to_load(model, optim, state["optim"]))


def check_round_trip_save(rank: int, world: int, tmp: str) -> None:
    """At world 4: both FSDPs write DTensor checkpoints; each loaded into fresh models of both
    trains on exactly as the run that never stopped."""
    for strategy, orig, optim_name in ROUND_TRIP:
        tag = f"save {strategy} orig={orig} {optim_name} w{world}"
        mesh = mesh_for(strategy, world)
        theirs, ours = wrap(TorchFSDP, strategy, orig, mesh), wrap(FerroFSDP, strategy, orig, mesh)
        t_opt = OPTIMIZERS[optim_name](theirs.parameters())
        o_opt = OPTIMIZERS[optim_name](ours.parameters())
        assert_same_losses(
            train(theirs, t_opt, rank, range(2)), train(ours, o_opt, rank, range(2)), tag
        )
        save(theirs, t_opt, TorchFSDP, f"{tmp}/dt-torch-{strategy}")
        save(ours, o_opt, FerroFSDP, f"{tmp}/dt-ferro-{strategy}")
        full = {"model": trainable(ours.state_dict()), "optim": full_optim(ours, o_opt, FerroFSDP)}
        if rank == 0:
            torch.save(full, f"{tmp}/dt-full-{strategy}.pt")
        reference = train(ours, o_opt, rank, range(2, 4))
        for cls, path in ((FerroFSDP, "ferro"), (TorchFSDP, "ferro"), (FerroFSDP, "torch")):
            model = wrap(cls, strategy, orig, mesh, seed=7)
            optim = OPTIMIZERS[optim_name](model.parameters())
            load(model, optim, cls, f"{tmp}/dt-{path}-{strategy}")
            losses = train(model, optim, rank, range(2, 4))
            assert_same_losses(reference, losses, f"{tag} {cls.__module__} <- {path}")
    dist.barrier()


def check_round_trip_load(rank: int, world: int, tmp: str) -> None:
    """At world 2: both checkpoints into both FSDPs (resharded by dcp); the FULL model and
    optimizer state are what was saved, and all four continue bitwise alike."""
    for strategy, orig, optim_name in ROUND_TRIP:
        saved = torch.load(f"{tmp}/dt-full-{strategy}.pt")
        mesh = mesh_for(strategy, world)
        runs = []
        for cls, path in (
            (TorchFSDP, "torch"),
            (FerroFSDP, "ferro"),
            (FerroFSDP, "torch"),
            (TorchFSDP, "ferro"),
        ):
            tag = f"load {strategy} w{world} {cls.__module__} <- {path}"
            model = wrap(cls, strategy, orig, mesh, seed=7)
            optim = OPTIMIZERS[optim_name](model.parameters())
            load(model, optim, cls, f"{tmp}/dt-{path}-{strategy}")
            assert_same(saved["model"], trainable(model.state_dict()), tag + " model")
            assert_same(saved["optim"], full_optim(model, optim, cls), tag + " optim")
            losses = train(model, optim, rank, range(2, 4))
            runs.append((tag, losses, model.state_dict(), full_optim(model, optim, cls)))
        for tag, losses, state, osd in runs[1:]:
            assert_same_losses(runs[0][1], losses, tag)
            assert_same(runs[0][2], state, tag + " model after")
            assert_same(runs[0][3], osd, tag + " optim after")
    dist.barrier()


def run_world(rank: int, world: int, tmp: str) -> None:
    init_world(rank, world, tmp)
    try:
        check_state_dicts(rank, world)
        if world == 4:
            check_round_trip_save(rank, world, tmp)
        else:
            check_round_trip_load(rank, world, tmp)
    finally:
        end_world()
