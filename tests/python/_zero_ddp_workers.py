"""Worker checks that need DDP or DTensor: ZeRO overlap hooks, Join, optimizer overlap and
ShardedOptimizer. Run inside the worlds started by test_zero.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook as torch_zero_hook
from _zero_workers import batch, make_model
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
from torch.nn.parallel import DistributedDataParallel as DDP

import ferrodist
import ferrodist.optim as fopt
from ferrodist.algorithms.ddp_comm_hooks import ddp_zero_hook as ours_zero_hook

# Small caps give several DDP buckets once DDP rebuilds them after iteration 1.
BUCKET_CAP_MB = 0.0002


@contextlib.contextmanager
def torch_hooks_allowed_on_gloo() -> Iterator[None]:
    """torch refuses its ZeRO hooks on gloo at construction; lift that check for the reference."""
    real = torch_zero_hook.dist.get_backend
    torch_zero_hook.dist.get_backend = lambda *a, **k: "nccl"  # type: ignore[assignment]
    try:
        yield
    finally:
        torch_zero_hook.dist.get_backend = real


def ddp_step(ddp: nn.Module, seed: int) -> None:
    x, y = batch(seed)
    ddp.zero_grad()
    nn.functional.mse_loss(ddp(x), y).backward()


def check_overlap_hooks(rank: int, world: int) -> None:
    """ZeRO stepping inside DDP's hook equals torch's hooks bit for bit, on gloo."""
    for interleaved in (False, True):
        for shard_buckets in (False, True):
            models = []
            for module, zero_cls in (
                (torch_zero_hook, TorchZero),
                (ours_zero_hook, fopt.ZeroRedundancyOptimizer),
            ):
                model = make_model()
                ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
                zero = zero_cls(
                    model.parameters(), torch.optim.Adam, overlap_with_ddp=True, lr=0.01
                )
                # torch's interleaved hook broadcasts from future callbacks, whose order differs
                # between ranks on gloo (a collective mismatch); its plain hook computes the
                # same update, so it is the reference for both of ours.
                if module is ours_zero_hook and interleaved:
                    wrap = module.hook_with_zero_step_interleaved
                else:
                    wrap = module.hook_with_zero_step
                with (
                    torch_hooks_allowed_on_gloo()
                    if module is torch_zero_hook
                    else contextlib.nullcontext()
                ):
                    ddp.register_comm_hook(
                        None, wrap(allreduce_hook, ddp, zero, shard_buckets=shard_buckets)
                    )
                models.append((model, ddp, zero))
            for step in range(5):
                for _, ddp, _ in models:
                    ddp_step(ddp, seed=100 * rank + step)
            (theirs, _, _), (ours, _, ours_zero) = models
            assert ours_zero._overlap_info.status == 2
            # The buckets ZeRO recorded are the ones DDP rebuilt, as the Rust bucket assignment
            # predicts from the gradient-ready order (reverse registration order here).
            params = list(ours.parameters())
            ready = list(reversed(range(len(params))))
            cap = int(BUCKET_CAP_MB * 1024 * 1024)
            predicted, _ = ferrodist.compute_bucket_assignment_by_size(
                [params[i] for i in ready], [cap, cap], tensor_indices=ready
            )
            index = {p: i for i, p in enumerate(params)}
            recorded = [[index[p] for p in b] for b in ours_zero._overlap_info.params_per_bucket]
            assert recorded == predicted, (recorded, predicted)
            fresh = make_model()
            assert any(not torch.equal(p, q) for p, q in zip(ours.parameters(), fresh.parameters()))
            for p, q in zip(ours.parameters(), theirs.parameters()):
                assert torch.equal(p, q), (interleaved, shard_buckets, world)


def check_overlap_errors(rank: int, world: int) -> None:
    model = make_model()
    ddp = DDP(model)
    plain = fopt.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    try:
        ours_zero_hook.hook_with_zero_step(allreduce_hook, ddp, plain)
    except ValueError as err:
        assert "overlap_with_ddp=True" in str(err)
    else:
        raise AssertionError("a non-overlap ZeRO must be refused by the hook")
    overlap = fopt.ZeroRedundancyOptimizer(
        model.parameters(), torch.optim.SGD, overlap_with_ddp=True, lr=0.1
    )
    assert overlap.step() is None  # a no-op (with a warning) in overlap mode
    try:
        overlap.consolidate_state_dict()
    except RuntimeError as err:
        assert "fully initialized" in str(err)
    else:
        raise AssertionError("consolidate before the overlap initialisation must raise")


def check_join_uneven_inputs(rank: int, world: int) -> None:
    """Ranks with fewer batches keep broadcasting their shard through ZeRO's join hook."""
    results = []
    for zero_cls in (TorchZero, fopt.ZeroRedundancyOptimizer):
        model = make_model()
        ddp = DDP(model)
        zero = zero_cls(model.parameters(), torch.optim.SGD, lr=0.05, momentum=0.9)
        with Join([ddp, zero]):
            for step in range(2 + rank):
                ddp_step(ddp, seed=100 * rank + step)
                zero.step()
        assert zero.join_device == torch.device("cpu")
        assert zero.join_process_group is dist.group.WORLD
        results.append([p.detach().clone() for p in model.parameters()])
    for p, q in zip(*results):
        assert torch.equal(p, q)


def check_overlapped_optimizer(rank: int, world: int) -> None:
    """register_ddp steps inside DDP's hook; result equals stepping after backward."""
    kwargs: dict[str, Any] = {"lr": 0.05, "momentum": 0.9}
    plain_model, fused_model, torch_fused_model = make_model(), make_model(), make_model()
    plain_ddp, fused_ddp = DDP(plain_model), DDP(fused_model)
    torch_ddp = DDP(torch_fused_model)
    # The same gradient arithmetic (divide, then sum) as the hook the overlapped optimizer wraps.
    plain_ddp.register_comm_hook(None, allreduce_hook)
    plain = torch.optim.SGD(plain_model.parameters(), **kwargs)
    overlapped = fopt._as_overlapped_optim(
        torch.optim.SGD, list(fused_model.parameters()), **kwargs
    )
    assert isinstance(overlapped, fopt.OverlappedOptimizer)
    overlapped.register_ddp(fused_ddp)
    torch_ddp._register_fused_optim(torch.optim.SGD, **kwargs)
    for step in range(3):
        ddp_step(plain_ddp, seed=100 * rank + step)
        plain.step()
        ddp_step(fused_ddp, seed=100 * rank + step)
        ddp_step(torch_ddp, seed=100 * rank + step)
    for p, q, r in zip(
        plain_model.parameters(), fused_model.parameters(), torch_fused_model.parameters()
    ):
        assert torch.equal(q, r), "ours != torch's _register_fused_optim"
        assert torch.equal(p, q)
    try:
        overlapped.register_fsdp(None)
    except NotImplementedError:
        pass
    else:
        raise AssertionError("register_fsdp must raise NotImplementedError")


def check_sharded_optimizer_dtensor(rank: int, world: int) -> None:
    """ShardedOptimizer over DTensor shards == the plain optimizer on the full tensor, and its
    state dict round-trips (torch's raises NotImplementedError)."""
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.tensor import Shard, distribute_tensor
    except ImportError:  # torch 2.4 keeps DTensor in the private module
        from torch.distributed._tensor import Shard, distribute_tensor  # type: ignore[no-redef]

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    full = torch.randn(4 * world, 3)
    extra_full = torch.randn(2 * world)

    def sharded_params() -> dict[str, nn.Parameter]:
        return {
            "w": nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(0)])),
            "b": nn.Parameter(torch.zeros(3)),
        }

    def loss(params: dict[str, torch.Tensor], step: int) -> torch.Tensor:
        w = params["w"].full_tensor() if hasattr(params["w"], "full_tensor") else params["w"]
        return ((w + params["b"]) ** 2).sum() * (step + 1)

    ref = {"w": nn.Parameter(full.clone()), "b": nn.Parameter(torch.zeros(3))}
    ref_opt = torch.optim.Adam(ref.values(), lr=0.01)
    params = sharded_params()
    opt = fopt.ShardedOptimizer(params, torch.optim.Adam, lr=0.01)
    for step in range(2):
        for p, o in ((ref, ref_opt), (params, opt)):
            o.zero_grad()
            loss(p, step).backward()
            o.step()
    saved = opt.state_dict()
    assert set(saved["state"]) == {"w", "b"} and saved["param_groups"][0]["params"] == ["w", "b"]
    # A fresh optimizer over fresh shards, loaded from the saved dict, continues identically.
    resumed_params = sharded_params()
    with torch.no_grad():
        for name in resumed_params:
            resumed_params[name].copy_(params[name])
    resumed = fopt.ShardedOptimizer(resumed_params, torch.optim.Adam, lr=0.01)
    resumed.load_state_dict(saved)
    for step in range(2, 4):
        for p, o in ((ref, ref_opt), (resumed_params, resumed)):
            o.zero_grad()
            loss(p, step).backward()
            o.step()
    assert torch.equal(resumed_params["w"].full_tensor(), ref["w"])
    assert torch.equal(resumed_params["b"], ref["b"])
    # add_param_group works and the new group steps.
    extra = nn.Parameter(distribute_tensor(extra_full.clone(), mesh, [Shard(0)]))
    resumed.add_param_group({"params": {"extra": extra}, "lr": 0.1})
    resumed.zero_grad()
    (extra.full_tensor() ** 2).sum().backward()
    resumed.step()
    assert not torch.equal(extra.full_tensor(), extra_full)
    assert "extra" in resumed.state_dict()["state"]


def run_ddp_checks(rank: int, world: int) -> None:
    check_overlap_hooks(rank, world)
    check_overlap_errors(rank, world)
    check_join_uneven_inputs(rank, world)
    check_overlapped_optimizer(rank, world)
    check_sharded_optimizer_dtensor(rank, world)
