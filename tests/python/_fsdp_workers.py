"""Worker functions for the FSDP tests, run in real processes on gloo (forked by the tests).

Every check runs torch's ``FullyShardedDataParallel`` and ferrodist's in the same processes, from
the same seed and the same per-rank batches, and asserts bit-identical losses, full state dicts
and optimizer states: torch's FSDP on CPU is the reference.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from _world_end import end_world
from torch import nn
from torch.distributed.fsdp import CPUOffload, OptimStateKeyType, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from ferrodist.fsdp import FullyShardedDataParallel as FerroFSDP

CPU = torch.device("cpu")
STEPS = 2


def init_world(rank: int, world: int, tmp: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    warnings.simplefilter("ignore", FutureWarning)  # NO_SHARD's deprecation notice
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/pg-{world}", rank=rank, world_size=world
    )


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.tanh(self.inner(x))) + x


def make_model(seed: int = 0) -> nn.Module:
    """Odd sizes, so shards split parameters and need end padding; a buffer too."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(7, 9),
        nn.BatchNorm1d(9),
        Block(9),
        Block(9),
        nn.Linear(9, 3),
    )


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(5, 7, generator=g), torch.randn(5, 3, generator=g)


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


def train(model: nn.Module, optim: torch.optim.Optimizer, rank: int, steps: int) -> list[float]:
    losses = []
    for step in range(steps):
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.detach())
    return losses


def assert_same_state(a: dict[str, Any], b: dict[str, Any], tag: str, exact: bool = True) -> None:
    assert list(a) == list(b), (tag, list(a), list(b))
    for key, value in a.items():
        same = torch.equal(value, b[key]) if exact else torch.allclose(value, b[key], rtol=1e-5)
        assert same, (tag, key)


# torch 2.4's FSDP clip_grad_norm_ gathers the parameters into sets and sums their norms in set
# order, i.e. by object address: two models cannot be made to round alike. ferrodist sums in
# parameter order, as torch does since 2.5; on 2.4 the clip is compared to float tolerance.
CLIP_SUMS_IN_ADDRESS_ORDER = tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 5)


def hybrid_groups(rank: int, world: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Shard within pairs of ranks, replicate across pairs (every rank creates every group)."""
    shard_size = 2 if world % 2 == 0 and world > 2 else world
    intra = None
    inter = None
    for start in range(0, world, shard_size):
        group = dist.new_group(list(range(start, start + shard_size)))
        if start <= rank < start + shard_size:
            intra = group
    for offset in range(shard_size):
        group = dist.new_group(list(range(offset, world, shard_size)))
        if rank % shard_size == offset:
            inter = group
    assert intra is not None and inter is not None
    return intra, inter


def wrap_both(
    strategy: ShardingStrategy,
    use_orig_params: bool,
    policy: bool,
    groups: Optional[Any],
) -> tuple[nn.Module, nn.Module]:
    kwargs: dict[str, Any] = dict(
        sharding_strategy=strategy, use_orig_params=use_orig_params, device_id=CPU
    )
    if groups is not None:
        kwargs["process_group"] = groups
    if policy:
        kwargs["auto_wrap_policy"] = ModuleWrapPolicy({Block, nn.Linear})
    theirs = TorchFSDP(make_model(), **kwargs)
    ours = FerroFSDP(make_model(), **kwargs)
    return theirs, ours


def check_parity(rank: int, world: int, configs: list[tuple[str, bool, bool, str]]) -> None:
    """For each (strategy, use_orig_params, policy, optimizer): torch == ferrodist, bitwise."""
    groups = None
    for strategy_name, use_orig_params, policy, optim_name in configs:
        strategy = ShardingStrategy[strategy_name]
        if strategy_name.startswith("HYBRID") or strategy_name == "_HYBRID_SHARD_ZERO2":
            groups = groups or hybrid_groups(rank, world)
            pg: Optional[Any] = groups
        else:
            pg = None
        tag = f"{strategy_name} orig={use_orig_params} policy={policy} {optim_name} w{world}"
        theirs, ours = wrap_both(strategy, use_orig_params, policy, pg)
        assert [n for n, _ in theirs.named_parameters()] == [
            n for n, _ in ours.named_parameters()
        ], tag
        assert [n for n, _ in theirs.named_buffers()] == [n for n, _ in ours.named_buffers()], tag
        for (name, p), (_, q) in zip(theirs.named_parameters(), ours.named_parameters()):
            assert p.shape == q.shape and torch.equal(p, q), (tag, name)
        assert_trained_alike(theirs, ours, rank, optim_name, tag)
    dist.barrier()


def assert_trained_alike(
    theirs: nn.Module, ours: nn.Module, rank: int, optim_name: str, tag: str
) -> None:
    """Train both the same way: losses, state dicts, parameters, optimizer states bitwise."""
    assert_same_state(theirs.state_dict(), ours.state_dict(), tag + " initial")
    make_optim = OPTIMIZERS[optim_name]
    theirs_optim = make_optim(theirs.parameters())
    ours_optim = make_optim(ours.parameters())
    theirs_losses = train(theirs, theirs_optim, rank, STEPS)
    ours_losses = train(ours, ours_optim, rank, STEPS)
    for step, (a, b) in enumerate(zip(theirs_losses, ours_losses)):
        assert torch.equal(a, b), (tag, step, a.item(), b.item())
    assert_same_state(theirs.state_dict(), ours.state_dict(), tag)
    for (name, p), (_, q) in zip(theirs.named_parameters(), ours.named_parameters()):
        assert torch.equal(p, q), (tag, name)
    theirs_state = theirs_optim.state_dict()["state"]
    ours_state = ours_optim.state_dict()["state"]
    assert sorted(theirs_state) == sorted(ours_state), tag
    for index, entry in theirs_state.items():
        for key, value in entry.items():
            assert torch.equal(value, ours_state[index][key]), (tag, index, key)


class TiedModel(nn.Module):
    """An output head sharing the embedding's weight, a buffer, and a side branch that the
    tests hand to FSDP as an ignored module (its gradients are never reduced)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 9)
        self.blocks = nn.Sequential(Block(9), Block(9))
        self.side = nn.Linear(9, 9)
        self.head = nn.Linear(9, 11, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) * self.scale
        return self.head(self.blocks(x) + self.side(x))


def check_ignored_and_shared(rank: int, world: int) -> None:
    """Tied parameters, a buffer and an ignored module: bitwise torch's after training."""
    for strategy_name, use_orig_params in [("FULL_SHARD", False), ("SHARD_GRAD_OP", True)]:
        tag = f"tied+ignored {strategy_name} orig={use_orig_params} w{world}"
        models = []
        for cls in (TorchFSDP, FerroFSDP):
            torch.manual_seed(0)
            model = TiedModel()
            models.append(
                cls(
                    model,
                    sharding_strategy=ShardingStrategy[strategy_name],
                    use_orig_params=use_orig_params,
                    device_id=CPU,
                    auto_wrap_policy=ModuleWrapPolicy({Block}),
                    ignored_modules=[model.side],
                )
            )
        theirs, ours = models
        assert [n for n, _ in theirs.named_parameters()] == [
            n for n, _ in ours.named_parameters()
        ], tag
        optims = [torch.optim.Adam(m.parameters(), lr=0.01) for m in models]
        for step in range(STEPS):
            g = torch.Generator().manual_seed(100 * step + rank)
            tokens = torch.randint(0, 11, (5, 4), generator=g)
            target = torch.randint(0, 11, (5, 4), generator=g)
            losses = []
            for model, optim in zip(models, optims):
                out = model(tokens)
                loss = nn.functional.cross_entropy(out.reshape(-1, 11), target.reshape(-1))
                loss.backward()
                optim.step()
                optim.zero_grad()
                losses.append(loss.detach())
            assert torch.equal(losses[0], losses[1]), (tag, step)
        state = theirs.state_dict()
        assert_same_state(state, ours.state_dict(), tag)
        assert torch.equal(state["head.weight"], state["embed.weight"]), tag
        for (name, p), (_, q) in zip(theirs.named_parameters(), ours.named_parameters()):
            assert torch.equal(p, q), (tag, name)
        # Loading the FULL state dict back (tied key included) keeps the tie.
        ours.load_state_dict(state)
        assert_same_state(state, ours.state_dict(), tag + " reloaded")
    dist.barrier()


def check_no_shard_state_dict_types(rank: int, world: int) -> None:
    """NO_SHARD under LOCAL or SHARDED gives (and loads) a FULL state dict, as torch's does."""
    from torch.distributed.fsdp import StateDictType

    for kind in (StateDictType.LOCAL_STATE_DICT, StateDictType.SHARDED_STATE_DICT):
        theirs, ours = wrap_both(ShardingStrategy.NO_SHARD, False, True, None)
        states = []
        for cls, model in ((TorchFSDP, theirs), (FerroFSDP, ours)):
            with cls.state_dict_type(model, kind):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    states.append(model.state_dict())
                    model.load_state_dict(states[-1])
            assert any("full_state_dict will" in str(w.message) for w in caught), (cls, kind)
        assert_same_state(states[0], states[1], f"NO_SHARD {kind}")
        assert all(type(v) is torch.Tensor for v in states[1].values()), kind
    dist.barrier()


def check_cpu_offload(rank: int, world: int) -> None:
    """``CPUOffload(offload_params=True)`` on a CPU-only machine, where torch's needs CUDA:
    ferrodist's trains to exactly the numbers of torch's FSDP without offload."""
    for strategy_name, use_orig_params in [
        ("FULL_SHARD", False),
        ("SHARD_GRAD_OP", True),
        ("NO_SHARD", True),
    ]:
        kwargs: dict[str, Any] = dict(
            sharding_strategy=ShardingStrategy[strategy_name],
            use_orig_params=use_orig_params,
            device_id=CPU,
            auto_wrap_policy=ModuleWrapPolicy({Block, nn.Linear}),
        )
        theirs = TorchFSDP(make_model(), **kwargs)
        ours = FerroFSDP(make_model(), cpu_offload=CPUOffload(offload_params=True), **kwargs)
        assert ours.cpu_offload.offload_params
        tag = f"offload {strategy_name} orig={use_orig_params} w{world}"
        assert_trained_alike(theirs, ours, rank, "adam", tag)
    dist.barrier()


PARITY_W2: list[tuple[str, bool, bool, str]] = [
    ("FULL_SHARD", False, False, "sgd"),
    ("FULL_SHARD", True, True, "adam"),
    ("SHARD_GRAD_OP", False, True, "sgd"),
    ("SHARD_GRAD_OP", True, False, "adam"),
    ("NO_SHARD", False, True, "adam"),
    ("HYBRID_SHARD", False, True, "adam"),
    ("_HYBRID_SHARD_ZERO2", True, True, "sgd"),
]

PARITY_W4: list[tuple[str, bool, bool, str]] = [
    ("FULL_SHARD", True, True, "adam"),
    ("HYBRID_SHARD", False, True, "sgd"),
]

PARITY_W3: list[tuple[str, bool, bool, str]] = [
    ("SHARD_GRAD_OP", False, True, "adam"),
]


def run_world(rank: int, world: int, tmp: str, load_from: Optional[int] = None) -> None:
    init_world(rank, world, tmp)
    try:
        check_parity(rank, world, {2: PARITY_W2, 3: PARITY_W3, 4: PARITY_W4}[world])
        if world == 2:
            check_summon_full_params(rank, world)
            check_no_sync_and_clip(rank, world)
            check_optim_state_dicts(rank, world)
            check_options_and_errors(rank, world)
            check_mixed_precision(rank, world)
            check_local_state_dict(rank, world)
            check_cpu_offload(rank, world)
            check_ignored_and_shared(rank, world)
            check_no_shard_state_dict_types(rank, world)
        if world == 4:
            check_device_mesh(rank, world)
        check_state_dict_interop(rank, world, tmp, load_from)
        check_sharded_checkpoint(rank, world, tmp, load_from)
    finally:
        end_world()


def step_both(
    theirs: nn.Module,
    ours: nn.Module,
    rank: int,
    step: int,
    tag: str,
    before_step: Optional[Callable[[nn.Module], Any]] = None,
    exact: bool = True,
) -> None:
    """One SGD step on each (fresh optimizers, so no state to match), losses compared."""
    results = []
    for model in (theirs, ours):
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        extra = before_step(model) if before_step is not None else None
        optim = torch.optim.SGD(model.parameters(), lr=0.1)
        optim.step()
        optim.zero_grad()
        results.append((loss.detach(), extra))

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-5)

    assert same(results[0][0], results[1][0]), (tag, step)
    if before_step is not None:
        a, b = results[0][1], results[1][1]
        assert same(a, b), (tag, a.item(), b.item(), a.shape, b.shape, a.dtype, b.dtype)


def check_summon_full_params(rank: int, world: int) -> None:
    for use_orig_params in (False, True):
        tag = f"summon orig={use_orig_params}"
        theirs, ours = wrap_both(ShardingStrategy.FULL_SHARD, use_orig_params, True, None)
        step_both(theirs, ours, rank, 0, tag)
        with TorchFSDP.summon_full_params(theirs), FerroFSDP.summon_full_params(ours):
            a, b = list(theirs.named_parameters()), list(ours.named_parameters())
            assert [n for n, _ in a] == [n for n, _ in b], (tag, a, b)
            for (name, p), (_, q) in zip(a, b):
                assert p.shape == q.shape and torch.equal(p, q), (tag, name)
            assert [n for n, _ in theirs.named_buffers()] == [n for n, _ in ours.named_buffers()]
            with torch.no_grad():
                for (_, p), (_, q) in zip(a[::3], b[::3]):
                    p.mul_(0.5)  # written back into every rank's shard on exit
                    q.mul_(0.5)
        assert_same_state(theirs.state_dict(), ours.state_dict(), tag + " writeback")
        step_both(theirs, ours, rank, 1, tag)
        reference = theirs.state_dict()
        with FerroFSDP.summon_full_params(ours, rank0_only=True, writeback=False):
            if rank == 0:
                full = dict(ours.named_parameters())
                assert_same_state(
                    {k: v for k, v in reference.items() if k in full},
                    {k: v.detach() for k, v in full.items()},
                    tag + " rank0_only",
                )
        assert_same_state(theirs.state_dict(), ours.state_dict(), tag + " after rank0_only")
        if use_orig_params:  # torch allows with_grads only with use_orig_params
            for model in (theirs, ours):
                x, y = batch(5, rank)
                nn.functional.mse_loss(model(x), y).backward()
            with (
                TorchFSDP.summon_full_params(theirs, with_grads=True),
                FerroFSDP.summon_full_params(ours, with_grads=True),
            ):
                for (name, p), (_, q) in zip(theirs.named_parameters(), ours.named_parameters()):
                    assert p.grad is not None and q.grad is not None, (tag, name)
                    assert torch.equal(p.grad, q.grad), (tag, "with_grads", name)
            step_both(theirs, ours, rank, 6, tag + " after with_grads")


def check_no_sync_and_clip(rank: int, world: int) -> None:
    for strategy, use_orig_params in [
        (ShardingStrategy.FULL_SHARD, False),
        (ShardingStrategy.FULL_SHARD, True),
        (ShardingStrategy.NO_SHARD, True),
    ]:
        tag = f"no_sync/clip {strategy.name} orig={use_orig_params}"
        theirs, ours = wrap_both(strategy, use_orig_params, True, None)
        for model in (theirs, ours):
            x, y = batch(7, rank)
            with model.no_sync():  # type: ignore[operator]
                nn.functional.mse_loss(model(x), y).backward()
        exact = not (CLIP_SUMS_IN_ADDRESS_ORDER and strategy != ShardingStrategy.NO_SHARD)
        step_both(theirs, ours, rank, 8, tag, lambda m: m.clip_grad_norm_(0.05), exact)
        assert_same_state(theirs.state_dict(), ours.state_dict(), tag, exact)
        # A second step accumulates onto nothing: no_sync state must not leak.
        clip = lambda m: m.clip_grad_norm_(0.5, norm_type=1.0)  # noqa: E731
        step_both(theirs, ours, rank, 9, tag, clip, exact)
        assert_same_state(theirs.state_dict(), ours.state_dict(), tag + " second", exact)


def check_state_dict_interop(rank: int, world: int, tmp: str, load_from: Optional[int]) -> None:
    """torch's FULL checkpoint loads into ours and ours into torch's, bitwise; a checkpoint
    saved at one world size loads at another."""
    for use_orig_params in (False, True):
        tag = f"interop orig={use_orig_params} w{world}"
        theirs, ours = wrap_both(ShardingStrategy.FULL_SHARD, use_orig_params, True, None)
        if load_from is not None:
            saved = torch.load(f"{tmp}/full-{load_from}-{use_orig_params}.pt")
            theirs.load_state_dict(saved)
            ours.load_state_dict(saved)
            assert_same_state(saved, ours.state_dict(), tag + " loaded")
        step_both(theirs, ours, rank, 0, tag)
        # torch -> ferrodist: a fresh model of ours (other seed) takes torch's checkpoint.
        torch.manual_seed(5)
        fresh = FerroFSDP(
            make_model(seed=5),
            use_orig_params=use_orig_params,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
        )
        result = fresh.load_state_dict(theirs.state_dict())
        assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []
        assert_same_state(theirs.state_dict(), fresh.state_dict(), tag + " torch->ours")
        step_both(theirs, fresh, rank, 1, tag + " torch->ours")
        # ferrodist -> torch.
        other = TorchFSDP(make_model(seed=6), device_id=CPU, use_orig_params=use_orig_params)
        other.load_state_dict(fresh.state_dict())
        assert_same_state(other.state_dict(), fresh.state_dict(), tag + " ours->torch")
        step_both(other, fresh, rank, 2, tag + " ours->torch")
        state = fresh.state_dict()
        if rank == 0:
            torch.save(state, f"{tmp}/full-{world}-{use_orig_params}.pt")
        try:
            fresh.load_state_dict({**state, "extra": torch.zeros(1)})
            raise AssertionError("strict load accepted an unexpected key")
        except RuntimeError as err:
            assert 'Unexpected key(s) in state_dict: "extra"' in str(err), err
    dist.barrier()


def assert_same_optim_state(a: dict[str, Any], b: dict[str, Any], tag: str) -> None:
    groups_a = [{**g, "params": sorted(g["params"])} for g in a["param_groups"]]
    groups_b = [{**g, "params": sorted(g["params"])} for g in b["param_groups"]]
    assert groups_a == groups_b, (tag, groups_a, groups_b)
    assert sorted(a["state"]) == sorted(b["state"]), (tag, sorted(a["state"]), sorted(b["state"]))
    for name, entry in a["state"].items():
        assert sorted(entry) == sorted(b["state"][name]), (tag, name)
        for key, value in entry.items():
            other = b["state"][name][key]
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, other), (tag, name, key)
            else:
                assert value == other, (tag, name, key)


def check_optim_state_dicts(rank: int, world: int) -> None:
    """FULL optimizer state dicts equal torch's; torch's loads into ours and continues
    bit-identically, and ours into torch's.

    The reference is always torch with ``use_orig_params=False``: torch 2.13's FULL optimizer
    state dict with ``use_orig_params=True`` swaps ``exp_avg`` and ``exp_avg_sq`` of a
    parameter that lies wholly outside rank 0's shard (seen with ``0.bias`` here), while its
    ``use_orig_params=False`` dict is right. Training is elementwise the same either way, so
    ferrodist's ``use_orig_params=True`` dict must equal torch's ``use_orig_params=False`` one,
    and loading across the two modes checks both directions.
    """
    for strategy, use_orig_params in [
        (ShardingStrategy.FULL_SHARD, False),
        (ShardingStrategy.FULL_SHARD, True),
        (ShardingStrategy.NO_SHARD, True),
    ]:
        tag = f"optim {strategy.name} orig={use_orig_params} w{world}"
        theirs, _ = wrap_both(strategy, False, True, None)
        _, ours = wrap_both(strategy, use_orig_params, True, None)
        theirs_optim = torch.optim.Adam(theirs.parameters(), lr=0.01)
        ours_optim = torch.optim.Adam(ours.parameters(), lr=0.01)
        train(theirs, theirs_optim, rank, 2)
        train(ours, ours_optim, rank, 2)
        theirs_full = TorchFSDP.optim_state_dict(theirs, theirs_optim)
        ours_full = FerroFSDP.optim_state_dict(ours, ours_optim)
        assert_same_optim_state(theirs_full, ours_full, tag)
        legacy = FerroFSDP.full_optim_state_dict(ours, ours_optim)
        if rank == 0:
            assert_same_optim_state(theirs_full, legacy, tag + " full_optim_state_dict")
        else:
            assert legacy == {}, tag
        # Swap: each side loads the other's checkpoint (model and optimizer) and continues.
        theirs_model, ours_model = theirs.state_dict(), ours.state_dict()
        theirs.load_state_dict(ours_model)
        ours.load_state_dict(theirs_model)
        theirs_optim.load_state_dict(
            TorchFSDP.optim_state_dict_to_load(theirs, theirs_optim, ours_full)
        )
        FerroFSDP.optim_state_dict_to_load(ours, ours_optim, theirs_full, load_directly=True)
        a = train(theirs, theirs_optim, rank, 2)
        b = train(ours, ours_optim, rank, 2)
        assert all(torch.equal(x, y) for x, y in zip(a, b)), tag
        assert_same_state(theirs.state_dict(), ours.state_dict(), tag + " after swap")
        assert_same_optim_state(
            TorchFSDP.optim_state_dict(theirs, theirs_optim),
            FerroFSDP.optim_state_dict(ours, ours_optim),
            tag + " after swap",
        )
        # The legacy path: rank 0's full dict scattered, re-keyed by ids and back.
        full = FerroFSDP.full_optim_state_dict(ours, ours_optim)
        scattered = FerroFSDP.scatter_full_optim_state_dict(
            full if rank == 0 else None, ours, optim=ours_optim
        )
        ours_full_now = FerroFSDP.optim_state_dict(ours, ours_optim)
        sharded = FerroFSDP.shard_full_optim_state_dict(ours_full_now, ours, optim=ours_optim)
        assert repr(scattered) == repr(sharded), tag
        by_id = FerroFSDP.rekey_optim_state_dict(
            ours_full_now, OptimStateKeyType.PARAM_ID, ours, optim=ours_optim
        )
        assert all(isinstance(k, int) for k in by_id["state"]), tag
        back = FerroFSDP.rekey_optim_state_dict(
            by_id, OptimStateKeyType.PARAM_NAME, ours, optim=ours_optim
        )
        assert_same_optim_state(ours_full_now, back, tag + " rekey")
    dist.barrier()


def check_options_and_errors(rank: int, world: int) -> None:
    """Options that change no number, comm hooks, and torch's errors for bad input."""
    from torch.distributed.algorithms._comm_hooks import default_hooks
    from torch.distributed.fsdp import BackwardPrefetch

    # Prefetch settings order communication only: the numbers stay torch's. (CPUOffload on a
    # CPU-only machine: check_cpu_offload.)
    options: list[dict[str, Any]] = [
        dict(backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True),
        dict(backward_prefetch=BackwardPrefetch.BACKWARD_POST, forward_prefetch=True),
        dict(backward_prefetch=None, limit_all_gathers=False),
    ]
    for extra in options:
        tag = f"options {extra}"
        policy = ModuleWrapPolicy({Block})
        theirs = TorchFSDP(make_model(), device_id=CPU, auto_wrap_policy=policy, **extra)
        ours = FerroFSDP(make_model(), device_id=CPU, auto_wrap_policy=policy, **extra)
        a = train(theirs, torch.optim.Adam(theirs.parameters(), lr=0.01), rank, 2)
        b = train(ours, torch.optim.Adam(ours.parameters(), lr=0.01), rank, 2)
        assert all(torch.equal(x, y) for x, y in zip(a, b)), tag
        assert_same_state(theirs.state_dict(), ours.state_dict(), tag)
    # torch's default comm hook, registered on both.
    theirs, ours = wrap_both(ShardingStrategy.FULL_SHARD, False, True, None)
    for model in (theirs, ours):
        model.register_comm_hook(  # type: ignore[operator]
            default_hooks.DefaultState(dist.group.WORLD), default_hooks.reduce_scatter_hook
        )
    a = train(theirs, torch.optim.SGD(theirs.parameters(), lr=0.1), rank, 2)
    b = train(ours, torch.optim.SGD(ours.parameters(), lr=0.1), rank, 2)
    assert all(torch.equal(x, y) for x, y in zip(a, b)), "comm hook"
    assert_same_state(theirs.state_dict(), ours.state_dict(), "comm hook")
    # Bad input.
    wrapped = FerroFSDP(make_model(), device_id=CPU)
    expect_error(
        ValueError,
        "FSDP auto wrapping requires modules to not already have FSDP applied",
        lambda: FerroFSDP(nn.Sequential(wrapped), auto_wrap_policy=ModuleWrapPolicy({Block})),
    )
    frozen = make_model()
    frozen[0].weight.requires_grad_(False)
    expect_error(
        ValueError,
        "Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`",
        lambda: FerroFSDP(frozen),
    )
    expect_error(
        ValueError,
        "Cannot pass both process_group and device_mesh",
        lambda: FerroFSDP(make_model(), process_group=dist.group.WORLD, device_mesh=object()),
    )
    differs = nn.Sequential(nn.Linear(7, 9 + rank), nn.Linear(9 + rank, 3))
    expect_error(
        RuntimeError,
        "FSDP expects same model across all ranks, but parameter 0 is '0.weight' [9, 7] "
        "float32 on rank 0 but '0.weight' [10, 7] float32 on rank 1",
        lambda: FerroFSDP(differs),
    )
    dist.barrier()


def expect_error(kind: type[BaseException], text: str, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except kind as err:
        assert text in str(err), (text, str(err))
        return
    raise AssertionError(f"expected {kind.__name__}: {text}")


def check_mixed_precision(rank: int, world: int) -> None:
    """bf16 and fp16 parameters, reductions and buffers: bitwise torch's."""
    from torch.distributed.fsdp import MixedPrecision

    cases = [
        (MixedPrecision(param_dtype=torch.bfloat16), ShardingStrategy.FULL_SHARD, False),
        (
            MixedPrecision(
                param_dtype=torch.float16,
                reduce_dtype=torch.float32,
                buffer_dtype=torch.float16,
            ),
            ShardingStrategy.FULL_SHARD,
            True,
        ),
        (
            MixedPrecision(param_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16),
            ShardingStrategy.SHARD_GRAD_OP,
            True,
        ),
        (MixedPrecision(param_dtype=torch.float16), ShardingStrategy.NO_SHARD, False),
    ]
    for precision, strategy, use_orig_params in cases:
        tag = f"mp {precision} {strategy.name} orig={use_orig_params}"
        kwargs: dict[str, Any] = dict(
            sharding_strategy=strategy,
            use_orig_params=use_orig_params,
            device_id=CPU,
            mixed_precision=precision,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
        )
        theirs = TorchFSDP(make_model(), **kwargs)
        ours = FerroFSDP(make_model(), **kwargs)
        results = []
        for model in (theirs, ours):
            optim = torch.optim.Adam(model.parameters(), lr=0.01)
            losses = []
            for step in range(STEPS):
                x, y = batch(step, rank)
                loss = nn.functional.mse_loss(model(x).float(), y)
                loss.backward()
                optim.step()
                optim.zero_grad()
                losses.append(loss.detach())
            results.append(losses)
        assert all(torch.equal(a, b) for a, b in zip(*results)), (tag, results)
        assert_same_state(theirs.state_dict(), ours.state_dict(), tag)
    dist.barrier()


def check_device_mesh(rank: int, world: int) -> None:
    """HYBRID_SHARD over a 2-D DeviceMesh (replicate x shard), as torch reads the mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, world // 2))
    for strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2):
        tag = f"mesh {strategy.name}"
        kwargs: dict[str, Any] = dict(
            sharding_strategy=strategy,
            device_mesh=mesh,
            device_id=CPU,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
        )
        theirs = TorchFSDP(make_model(), **kwargs)
        ours = FerroFSDP(make_model(), **kwargs)
        a = train(theirs, torch.optim.Adam(theirs.parameters(), lr=0.01), rank, STEPS)
        b = train(ours, torch.optim.Adam(ours.parameters(), lr=0.01), rank, STEPS)
        assert all(torch.equal(x, y) for x, y in zip(a, b)), tag
        assert_same_state(theirs.state_dict(), ours.state_dict(), tag)
    dist.barrier()


def assert_same_local_state(a: dict[str, Any], b: dict[str, Any], tag: str) -> None:
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    assert list(a) == list(b), (tag, list(a), list(b))
    for key, value in a.items():
        other = b[key]
        if isinstance(value, ShardedTensor):
            assert isinstance(other, ShardedTensor), (tag, key)
            assert value.size() == other.size(), (tag, key)
            meta_a = [(m.shard_offsets, m.shard_sizes) for m in value.metadata().shards_metadata]
            meta_b = [(m.shard_offsets, m.shard_sizes) for m in other.metadata().shards_metadata]
            assert meta_a == meta_b, (tag, key, meta_a, meta_b)
            mine = [s.tensor for s in value.local_shards()]
            theirs = [s.tensor for s in other.local_shards()]
            assert len(mine) == len(theirs), (tag, key)
            assert all(torch.equal(x, y) for x, y in zip(mine, theirs)), (tag, key)
        else:
            assert torch.equal(value, other), (tag, key)


def check_local_state_dict(rank: int, world: int) -> None:
    """LOCAL state dicts: torch's ShardedTensors and keys, loadable both ways."""
    from torch.distributed.fsdp import StateDictType

    local = StateDictType.LOCAL_STATE_DICT
    theirs, ours = wrap_both(ShardingStrategy.FULL_SHARD, False, True, None)
    step_both(theirs, ours, rank, 0, "local")
    with TorchFSDP.state_dict_type(theirs, local), FerroFSDP.state_dict_type(ours, local):
        assert_same_local_state(theirs.state_dict(), ours.state_dict(), "local")
    # torch's LOCAL checkpoint into a fresh model of ours (other seed), and ours into torch's.
    kwargs: dict[str, Any] = dict(
        device_id=CPU, auto_wrap_policy=ModuleWrapPolicy({Block, nn.Linear})
    )
    fresh_ours = FerroFSDP(make_model(seed=3), **kwargs)
    fresh_theirs = TorchFSDP(make_model(seed=4), **kwargs)
    with TorchFSDP.state_dict_type(theirs, local), FerroFSDP.state_dict_type(fresh_ours, local):
        result = fresh_ours.load_state_dict(theirs.state_dict())
        assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []
    with TorchFSDP.state_dict_type(fresh_theirs, local), FerroFSDP.state_dict_type(ours, local):
        fresh_theirs.load_state_dict(ours.state_dict())
    assert_same_state(theirs.state_dict(), fresh_ours.state_dict(), "local torch->ours")
    assert_same_state(theirs.state_dict(), fresh_theirs.state_dict(), "local ours->torch")
    step_both(fresh_theirs, fresh_ours, rank, 1, "local after load")
    dist.barrier()


def check_sharded_checkpoint(rank: int, world: int, tmp: str, load_from: Optional[int]) -> None:
    """SHARDED state dicts through torch.distributed.checkpoint: the same ShardedTensors as
    torch's; saved at one world size, loaded at another, into torch's FSDP and ours."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import StateDictType

    sharded = StateDictType.SHARDED_STATE_DICT
    theirs, ours = wrap_both(ShardingStrategy.FULL_SHARD, False, True, None)
    if load_from is not None:
        for model, cls in ((theirs, TorchFSDP), (ours, FerroFSDP)):
            with cls.state_dict_type(model, sharded):  # type: ignore[attr-defined]
                template = model.state_dict()
                dcp.load(template, checkpoint_id=f"{tmp}/sharded-{load_from}")
                model.load_state_dict(template)
        assert_same_state(theirs.state_dict(), ours.state_dict(), "sharded loaded")
        # Parameters are what was trained; BatchNorm's running stats differ per rank and
        # the checkpoint keeps one rank's copy of each, so they are compared torch vs ours only.
        expected = torch.load(f"{tmp}/sharded-full-{load_from}.pt")
        params = dict(ours.state_dict())
        for key, value in expected.items():
            if "running_" not in key and "num_batches" not in key:
                assert torch.equal(value, params[key]), ("sharded loaded", key)
    step_both(theirs, ours, rank, 0, "sharded")
    with TorchFSDP.state_dict_type(theirs, sharded), FerroFSDP.state_dict_type(ours, sharded):
        assert_same_local_state(theirs.state_dict(), ours.state_dict(), f"sharded w{world}")
        dcp.save(ours.state_dict(), checkpoint_id=f"{tmp}/sharded-{world}")
    full = ours.state_dict()
    if rank == 0:
        torch.save(full, f"{tmp}/sharded-full-{world}.pt")
    dist.barrier()
