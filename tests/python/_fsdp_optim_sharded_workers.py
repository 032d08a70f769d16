"""Worker functions for the SHARDED/LOCAL optimizer state-dict tests (spawned gloo worlds).

torch's FSDP is the reference throughout: both FSDPs train the same model from the same batches,
and their optimizer state dicts, the dicts ready to load, and the training after a reload are
compared bitwise. The checkpoint round trip goes through ``torch.distributed.checkpoint``:
saved at world 4 by both FSDPs, loaded at worlds 2 and 3 by both, crosswise.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from _fsdp_workers import (
    CPU,
    OPTIMIZERS,
    Block,
    assert_same_local_state,
    batch,
    hybrid_groups,
    init_world,
    make_model,
)
from _world_end import end_world
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP
from torch.distributed.fsdp import ShardingStrategy, StateDictType
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from ferrodist.fsdp import FullyShardedDataParallel as FerroFSDP

SHARDED = StateDictType.SHARDED_STATE_DICT
LOCAL = StateDictType.LOCAL_STATE_DICT
FULL = StateDictType.FULL_STATE_DICT

# (use_orig_params, optimizer): both parameter modes, Adam (tensor step) and SGD with momentum.
CONFIGS = [(False, "adam"), (True, "adam"), (False, "sgd"), (True, "sgd")]
ROUND_TRIP = [(False, "adam"), (True, "sgd")]


def wrap(cls: Any, orig: bool, seed: int = 0) -> Any:
    return cls(
        make_model(seed),
        use_orig_params=orig,
        device_id=CPU,
        auto_wrap_policy=ModuleWrapPolicy({Block, nn.Linear}),
    )


def train(model: nn.Module, optim: Any, rank: int, steps: range) -> list[torch.Tensor]:
    losses = []
    for step in steps:
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.detach())
    return losses


def assert_same_values(a: Any, b: Any, tag: str) -> None:
    """Same type, same keys in the same order, bitwise-equal tensors, equal ShardedTensors."""
    assert type(a) is type(b), (tag, type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b), (tag, list(a), list(b))
        for key in a:
            assert_same_values(a[key], b[key], f"{tag}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), tag
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_values(x, y, f"{tag}[{i}]")
    elif isinstance(a, ShardedTensor):
        assert_same_local_state({"v": a}, {"v": b}, tag)
        assert a.metadata() == b.metadata(), (tag, a.metadata(), b.metadata())
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (tag, a, b)
    else:
        assert a == b, (tag, a, b)


def names_sorted(osd: dict[str, Any]) -> dict[str, Any]:
    """``osd`` with each entry's state names sorted: torch's flat-parameter loading path lists
    them in set order, which varies with the interpreter's hash seed."""
    state = {key: dict(sorted(entry.items())) for key, entry in osd["state"].items()}
    return {**osd, "state": state}


def assert_same_losses(a: list[torch.Tensor], b: list[torch.Tensor], tag: str) -> None:
    for step, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), (tag, step, x.item(), y.item())


def check_optim_state_dicts(rank: int, world: int) -> None:
    """SHARDED and LOCAL optimizer state dicts, the deprecated names, and loading: torch's
    dict into ours and ours into torch's give what the optimizer itself holds."""
    for orig, optim_name in CONFIGS if world == 2 else ROUND_TRIP:
        tag = f"orig={orig} {optim_name} w{world}"
        theirs, ours = wrap(TorchFSDP, orig), wrap(FerroFSDP, orig)
        t_opt = OPTIMIZERS[optim_name](theirs.parameters())
        o_opt = OPTIMIZERS[optim_name](ours.parameters())
        assert_same_losses(
            train(theirs, t_opt, rank, range(2)), train(ours, o_opt, rank, range(2)), tag
        )
        for kind in (SHARDED, LOCAL):
            ktag = f"{tag} {kind.name}"
            with TorchFSDP.state_dict_type(theirs, kind), FerroFSDP.state_dict_type(ours, kind):
                t_osd = TorchFSDP.optim_state_dict(theirs, t_opt)
                o_osd = FerroFSDP.optim_state_dict(ours, o_opt)
                assert_same_values(t_osd, o_osd, ktag)
                # Crosswise: each takes the other's dict; both must give back the optimizer's.
                t_load = TorchFSDP.optim_state_dict_to_load(theirs, t_opt, o_osd)
                o_load = FerroFSDP.optim_state_dict_to_load(ours, o_opt, t_osd)
            assert_same_values(names_sorted(t_load), names_sorted(o_load), ktag + " to_load")
            assert_same_values(
                names_sorted(o_load), names_sorted(o_opt.state_dict()), ktag + " == optimizer's"
            )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t_old = TorchFSDP.sharded_optim_state_dict(theirs, t_opt)
            o_old = FerroFSDP.sharded_optim_state_dict(ours, o_opt)
            assert_same_values(t_old, o_old, tag + " sharded_optim_state_dict")
            t_flat = TorchFSDP.flatten_sharded_optim_state_dict(o_old, theirs, t_opt)
            o_flat = FerroFSDP.flatten_sharded_optim_state_dict(t_old, ours, o_opt)
            assert_same_values(
                names_sorted(t_flat),
                names_sorted(o_flat),
                tag + " flatten_sharded",
            )
        messages = [str(w.message) for w in caught if w.category is FutureWarning]
        for name in ("sharded_optim_state_dict", "flatten_sharded_optim_state_dict"):
            expected = [m for m in messages if m.startswith(f"``FullyShardedDataParallel.{name}``")]
            assert len(expected) == 2, (tag, name, messages)  # torch's and ours, same text
            assert expected[0] == expected[1], (tag, expected)
        # Fresh optimizers loaded from the crosswise dicts keep training in step.
        t_new = OPTIMIZERS[optim_name](theirs.parameters())
        o_new = OPTIMIZERS[optim_name](ours.parameters())
        t_new.load_state_dict(t_load)
        o_new.load_state_dict(o_load)
        assert_same_losses(
            train(theirs, t_new, rank, range(2, 4)), train(ours, o_new, rank, range(2, 4)), tag
        )
        assert_same_values(
            names_sorted(t_new.state_dict()), names_sorted(o_new.state_dict()), tag + " after"
        )
    dist.barrier()


def check_strategies(rank: int, world: int) -> None:
    """The SHARDED optimizer state dict beyond FULL_SHARD: hybrid groups (chunks over the
    shard group), NO_SHARD (torch chunks flat states but leaves use_orig_params states whole),
    ignored modules (plain states) and frozen parameters; each loaded crosswise."""
    configs: list[tuple[str, bool, str, str]] = (
        [("HYBRID_SHARD", False, "adam", ""), ("HYBRID_SHARD", True, "sgd", "")]
        if world == 4
        else [
            ("NO_SHARD", False, "adam", ""),
            ("NO_SHARD", True, "adam", ""),
            ("SHARD_GRAD_OP", True, "adam", "ignored"),
            ("FULL_SHARD", False, "sgd", "ignored"),
            ("FULL_SHARD", True, "adam", "frozen"),
        ]
    )
    groups = hybrid_groups(rank, world) if world == 4 else None
    for strategy, orig, optim_name, extra in configs:
        tag = f"{strategy} orig={orig} {optim_name} {extra} w{world}"
        models = []
        for cls in (TorchFSDP, FerroFSDP):
            kwargs: dict[str, Any] = dict(sharding_strategy=ShardingStrategy[strategy])
            if strategy.startswith("HYBRID"):
                kwargs["process_group"] = groups
            model = make_model()
            if extra == "ignored":
                kwargs["ignored_modules"] = [model[4]]
            if extra == "frozen":
                model[2].inner.weight.requires_grad_(False)
            model = cls(
                model,
                use_orig_params=orig,
                device_id=CPU,
                auto_wrap_policy=ModuleWrapPolicy({Block, nn.Linear}),
                **kwargs,
            )
            optim = OPTIMIZERS[optim_name]([p for p in model.parameters() if p.requires_grad])
            models.append((model, optim, cls, train(model, optim, rank, range(2))))
        (theirs, t_opt, _, t_losses), (ours, o_opt, _, o_losses) = models
        assert_same_losses(t_losses, o_losses, tag)
        with TorchFSDP.state_dict_type(theirs, SHARDED), FerroFSDP.state_dict_type(ours, SHARDED):
            t_osd = TorchFSDP.optim_state_dict(theirs, t_opt)
            o_osd = FerroFSDP.optim_state_dict(ours, o_opt)
            assert_same_values(t_osd, o_osd, tag)
            t_load = TorchFSDP.optim_state_dict_to_load(theirs, t_opt, o_osd)
            o_load = FerroFSDP.optim_state_dict_to_load(ours, o_opt, t_osd)
        assert_same_values(names_sorted(t_load), names_sorted(o_load), tag + " to_load")
        assert_same_values(names_sorted(o_load), names_sorted(o_opt.state_dict()), tag + " own")
    dist.barrier()


def check_local_orig_params(rank: int, world: int) -> None:
    """LOCAL model state dicts with use_orig_params=True: torch's keys and values (each
    original as its slice of the shard, plus every unit's flat ShardedTensor), and torch's
    strict and non-strict loading."""
    theirs, ours = wrap(TorchFSDP, True), wrap(FerroFSDP, True)
    t_opt, o_opt = (
        torch.optim.SGD(theirs.parameters(), lr=0.1),
        torch.optim.SGD(ours.parameters(), lr=0.1),
    )
    train(theirs, t_opt, rank, range(1))
    train(ours, o_opt, rank, range(1))
    with TorchFSDP.state_dict_type(theirs, LOCAL), FerroFSDP.state_dict_type(ours, LOCAL):
        t_sd, o_sd = theirs.state_dict(), ours.state_dict()
    assert_same_local_state(t_sd, o_sd, "local orig")
    for key, value in o_sd.items():
        assert type(value) is type(t_sd[key]), ("local orig", key)
    fresh_t, fresh_o = wrap(TorchFSDP, True, seed=3), wrap(FerroFSDP, True, seed=4)
    errors = []
    for model, cls, state in ((fresh_t, TorchFSDP, o_sd), (fresh_o, FerroFSDP, t_sd)):
        with cls.state_dict_type(model, LOCAL):
            try:
                model.load_state_dict(state)
                errors.append("")
            except RuntimeError as err:
                errors.append(str(err))
            errors.append(model.load_state_dict(state, strict=False))
    assert errors[0] and errors[0] == errors[2], errors
    assert errors[1] == errors[3], errors
    for model in (fresh_t, fresh_o):
        assert_same_values(theirs.state_dict(), model.state_dict(), "local orig loaded")
    t_opt = torch.optim.SGD(fresh_t.parameters(), lr=0.1)
    o_opt = torch.optim.SGD(fresh_o.parameters(), lr=0.1)
    assert_same_losses(
        train(fresh_t, t_opt, rank, range(1, 3)),
        train(fresh_o, o_opt, rank, range(1, 3)),
        "local orig after load",
    )
    dist.barrier()


def save(model: Any, optim: Any, cls: Any, path: str) -> None:
    import torch.distributed.checkpoint as dcp

    with cls.state_dict_type(model, SHARDED):
        state = {"model": model.state_dict(), "optim": cls.optim_state_dict(model, optim)}
        dcp.save(state, checkpoint_id=path)


def load(model: Any, optim: Any, cls: Any, path: str) -> None:
    """The user's load: dcp.load of the model, the optimizer state resharded by dcp to this
    world, then ``optim_state_dict_to_load``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict

    with cls.state_dict_type(model, SHARDED):
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=path)
        model.load_state_dict(state["model"])
        osd = load_sharded_optimizer_state_dict(
            model_state_dict=state["model"],
            optimizer_key="optim",
            storage_reader=dcp.FileSystemReader(path),
        )
        optim.load_state_dict(cls.optim_state_dict_to_load(model, optim, osd["optim"]))


def full_optim(model: Any, optim: Any, cls: Any) -> dict[str, Any]:
    """The FULL optimizer state dict, each param group's keys sorted: the order is lost on
    the way through torch.distributed.checkpoint (torch's FSDP reloads it in another one)."""
    with cls.state_dict_type(model, FULL):
        osd = cls.optim_state_dict(model, optim)
    return {**osd, "param_groups": [dict(sorted(g.items())) for g in osd["param_groups"]]}


def trainable(state: dict[str, Any]) -> dict[str, Any]:
    """A model state dict without BatchNorm's running statistics: every rank has its own, a
    checkpoint keeps one rank's copy, and training-mode forwards never read them."""
    return {k: v for k, v in state.items() if "running_" not in k and "num_batches" not in k}


def check_round_trip_save(rank: int, world: int, tmp: str) -> None:
    """At the saving world: both FSDPs write a checkpoint; ours reloaded into fresh models
    (ours and torch's) trains exactly as the run that never stopped."""
    for orig, optim_name in ROUND_TRIP:
        tag = f"save orig={orig} {optim_name} w{world}"
        theirs, ours = wrap(TorchFSDP, orig), wrap(FerroFSDP, orig)
        t_opt = OPTIMIZERS[optim_name](theirs.parameters())
        o_opt = OPTIMIZERS[optim_name](ours.parameters())
        assert_same_losses(
            train(theirs, t_opt, rank, range(2)), train(ours, o_opt, rank, range(2)), tag
        )
        save(theirs, t_opt, TorchFSDP, f"{tmp}/torch-{orig}")
        save(ours, o_opt, FerroFSDP, f"{tmp}/ferro-{orig}")
        full = {"model": trainable(ours.state_dict()), "optim": full_optim(ours, o_opt, FerroFSDP)}
        if rank == 0:
            torch.save(full, f"{tmp}/full-{orig}.pt")
        reference = train(ours, o_opt, rank, range(2, 4))
        for cls, path in ((FerroFSDP, "ferro"), (TorchFSDP, "ferro"), (FerroFSDP, "torch")):
            model = wrap(cls, orig, seed=7)
            optim = OPTIMIZERS[optim_name](model.parameters())
            load(model, optim, cls, f"{tmp}/{path}-{orig}")
            losses = train(model, optim, rank, range(2, 4))
            assert_same_losses(reference, losses, f"{tag} {cls.__module__} <- {path}")
    dist.barrier()


def check_round_trip_load(rank: int, world: int, tmp: str) -> None:
    """At another world: both checkpoints into both FSDPs; the FULL model and optimizer state
    are what was saved, and all four continue bitwise alike."""
    for orig, optim_name in ROUND_TRIP:
        saved = torch.load(f"{tmp}/full-{orig}.pt")
        runs = []
        for cls, path in (
            (TorchFSDP, "torch"),
            (FerroFSDP, "ferro"),
            (FerroFSDP, "torch"),
            (TorchFSDP, "ferro"),
        ):
            tag = f"load orig={orig} {optim_name} w{world} {cls.__module__} <- {path}"
            model = wrap(cls, orig, seed=7)
            optim = OPTIMIZERS[optim_name](model.parameters())
            load(model, optim, cls, f"{tmp}/{path}-{orig}")
            assert_same_values(saved["model"], trainable(model.state_dict()), tag + " model")
            assert_same_values(saved["optim"], full_optim(model, optim, cls), tag + " optim")
            losses = train(model, optim, rank, range(2, 4))
            runs.append((tag, losses, model.state_dict(), full_optim(model, optim, cls)))
        for tag, losses, state, osd in runs[1:]:
            assert_same_losses(runs[0][1], losses, tag)
            assert_same_values(runs[0][2], state, tag + " model after")
            assert_same_values(runs[0][3], osd, tag + " optim after")
    dist.barrier()


def run_world(rank: int, world: int, tmp: str) -> None:
    init_world(rank, world, tmp)
    try:
        if world == 4:
            check_optim_state_dicts(rank, world)
            check_strategies(rank, world)
            check_round_trip_save(rank, world, tmp)
        else:
            if world == 2:
                check_optim_state_dicts(rank, world)
                check_strategies(rank, world)
                check_local_orig_params(rank, world)
            check_round_trip_load(rank, world, tmp)
    finally:
        end_world()
