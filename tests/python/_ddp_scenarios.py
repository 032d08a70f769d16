"""Training scenarios run side by side on torch's DDP and ferrodist's DDP (helper of test_ddp).

Each scenario builds the same model twice from one seed, wraps one copy in torch's DDP and the
other in ferrodist's, feeds both the same rank-dependent batches, and returns what the test
compares: final parameters and gradients, and the bucket layout each DDP handed its hook.
Runs inside spawned worker processes with gloo initialised.

The sparse scenarios run each side in a world of its own: ferrodist's side here, torch's in a
world that never loads ferrodist (``torch_sparse_sides``, run by ``_torch_only_world``). torch's
gloo sparse all-reduce corrupts the heap now and then, far more often in a process that has any
Rust extension module loaded (README, DDP table); ferrodist's DDP no longer calls it (its own sum,
``ferrodist._sparse_all_reduce``), so neither world runs that code beside a Rust extension. This
module therefore imports ferrodist only when a ferrodist side runs.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP


def _ferrodist_side() -> tuple[Any, Any]:
    """ferrodist's DDP class and default hooks, imported when a ferrodist side runs."""
    from ferrodist.algorithms.ddp_comm_hooks import default_hooks
    from ferrodist.nn import DistributedDataParallel

    return DistributedDataParallel, default_hooks


class Net(nn.Module):
    """MLP with an optional unused layer, an optional tied weight, a BatchNorm buffer, a
    sparse embedding in front and a wide middle (weights of 16,384 elements, which the Reducer
    copies one by one as their gradients arrive: ``ferrodist.ddp.bucket.SMALL_NUMEL``)."""

    def __init__(
        self,
        unused: bool = False,
        tied: bool = False,
        bn: bool = False,
        sparse: bool = False,
        wide: bool = False,
    ) -> None:
        super().__init__()
        self.emb = nn.Embedding(40, 16, sparse=True) if sparse else None
        self.inp = nn.Linear(16, 64)
        self.bn = nn.BatchNorm1d(64) if bn else None
        self.mid = nn.Linear(64, 64)
        self.mid2 = nn.Linear(64, 64)
        if tied:
            self.mid2.weight = self.mid.weight
        self.out = nn.Linear(64, 4)
        self.spare = nn.Linear(64, 64) if unused else None
        self.wide = None
        if wide:
            self.wide = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))

    def forward(self, x: torch.Tensor, use_spare: bool = False) -> torch.Tensor:
        if self.emb is not None:
            x = x + self.emb((x.abs() * 7).long() % 40).mean(1)
        h = torch.relu(self.inp(x))
        if self.bn is not None:
            h = self.bn(h)
        h = torch.relu(self.mid(h))
        h = torch.relu(self.mid2(h))
        if self.wide is not None:
            h = h + self.wide(h)
        if use_spare and self.spare is not None:
            h = h + self.spare(h)
        return self.out(h)


def _batches(rank: int, steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randn(8, 16, generator=g) for _ in range(steps)]


def _layout_recorder(ddp: Any, hook: Callable[..., Any], log: list[Any]) -> Callable[..., Any]:
    names = {id(p): n for n, p in ddp.module.named_parameters()}

    def recording_hook(state, bucket):  # type: ignore[no-untyped-def]  # no annotations: DDP checks them
        log.append((bucket.index(), bucket.is_last(), [names[id(p)] for p in bucket.parameters()]))
        return hook(state, bucket)

    return recording_hook


def run(
    *,
    model: dict[str, bool] | None = None,
    ddp: dict[str, Any] | None = None,
    steps: int = 4,
    hook: str | None = None,
    no_sync_every: int = 0,
    spare_on_rank: int | None = None,
    record: bool = False,
    zero_grad_to_none: bool = True,
    swap_hooks: bool = False,
    dtype: torch.dtype = torch.float32,
    sides: tuple[str, ...] = ("torch", "ferrodist"),
) -> dict[str, Any]:
    """Train both DDPs (or the ``sides`` named); return ``{"torch": ..., "ferrodist": ...}``."""
    rank = dist.get_rank()
    torch.manual_seed(7 + rank)  # different inits per rank: DDP's broadcast must fix them
    base = Net(**(model or {})).to(dtype)
    results = {}
    for kind in sides:
        ddp_cls, hooks = (TorchDDP, torch_hooks) if kind == "torch" else _ferrodist_side()
        net = copy.deepcopy(base)
        wrapped = ddp_cls(net, **(ddp or {}))
        layout: list[Any] = []
        if hook is not None:
            if swap_hooks:  # torch's DDP runs ferrodist's hook and the other way round
                hooks = _ferrodist_side()[1] if hooks is torch_hooks else torch_hooks
            fn = getattr(hooks, hook)
            if hook.endswith("_wrapper"):
                fn = fn(hooks.allreduce_hook)
            if record:
                fn = _layout_recorder(wrapped, fn, layout)
            wrapped.register_comm_hook(None, fn)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
        for step, x in enumerate(_batches(rank, steps)):
            x = x.to(dtype)
            use_spare = spare_on_rank is not None and (spare_on_rank < 0 or rank == spare_on_rank)
            accumulate = no_sync_every and (step % no_sync_every) != no_sync_every - 1
            if accumulate:
                with wrapped.no_sync():
                    wrapped(x, use_spare).square().mean().backward()
                continue
            wrapped(x, use_spare).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=zero_grad_to_none)
        results[kind] = {
            "params": {n: p.detach().clone() for n, p in net.named_parameters()},
            "buffers": {n: b.detach().clone() for n, b in net.named_buffers()},
            "layout": layout,
            "rebuilt": bool(wrapped._has_rebuilt_buckets),
        }
    return results


def subgroup() -> dict[str, Any]:
    """DDP over ``new_group([1, 2])``: group rank 0 is global rank 1; rank 0 sits out."""
    group = dist.new_group([1, 2])
    if dist.get_rank() == 0:
        empty: dict[str, Any] = {"params": {}, "buffers": {}}
        return {"torch": empty, "ferrodist": empty}
    return run(model={"bn": True}, ddp={"bucket_cap_mb": 0.01, "process_group": group})


def uneven_join(divide_by_initial_world_size: bool = True) -> dict[str, Any]:
    """Rank r trains on 3 + 2r batches inside ``ddp.join()``; both DDPs must agree."""
    rank = dist.get_rank()
    torch.manual_seed(3)
    base = Net(bn=True)
    results = {}
    for kind, ddp_cls in (("torch", TorchDDP), ("ferrodist", _ferrodist_side()[0])):
        net = copy.deepcopy(base)
        wrapped = ddp_cls(net, bucket_cap_mb=0.01)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.05)
        with wrapped.join(divide_by_initial_world_size=divide_by_initial_world_size):
            for x in _batches(rank, 3 + 2 * rank):
                wrapped(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
        results[kind] = {"params": {n: p.detach().clone() for n, p in net.named_parameters()}}
    return results


def mismatch_error() -> str:
    """Construct ferrodist's DDP over models that differ on rank 1; return the error text."""
    rank = dist.get_rank()
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 3 + (rank == 1)))
    try:
        _ferrodist_side()[0](net)
    except RuntimeError as e:
        return str(e)
    return ""


def unused_without_detection() -> str:
    """An unused parameter without find_unused_parameters: the next forward must explain it."""
    net = Net(unused=True)
    wrapped = _ferrodist_side()[0](net)
    x = _batches(dist.get_rank(), 1)[0]
    wrapped(x).sum().backward()
    try:
        wrapped(x)
    except RuntimeError as e:
        return str(e)
    return ""


def fused_optimizer() -> dict[str, Any]:
    """torch's optimizer-overlap hook (``_register_fused_optim``) on both DDPs."""
    rank = dist.get_rank()
    torch.manual_seed(11)
    base = Net()
    results = {}
    for kind, ddp_cls in (("torch", TorchDDP), ("ferrodist", _ferrodist_side()[0])):
        net = copy.deepcopy(base)
        wrapped = ddp_cls(net)
        wrapped._register_fused_optim(torch.optim.SGD, lr=0.1)
        for x in _batches(rank, 3):
            wrapped(x).square().mean().backward()
        results[kind] = {"params": {n: p.detach().clone() for n, p in net.named_parameters()}}
    return results


def builtin_hook(kind_name: str) -> dict[str, Any]:
    """``_register_builtin_comm_hook`` with torch's enum on torch, ferrodist's on ours."""
    rank = dist.get_rank()
    torch.manual_seed(5)
    base = Net()
    results = {}
    import ferrodist

    for kind, ddp_cls, enum in (
        ("torch", TorchDDP, dist.BuiltinCommHookType),
        ("ferrodist", _ferrodist_side()[0], ferrodist.BuiltinCommHookType),
    ):
        net = copy.deepcopy(base)
        wrapped = ddp_cls(net)
        wrapped._register_builtin_comm_hook(getattr(enum, kind_name))
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.05)
        for x in _batches(rank, 3):
            wrapped(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        results[kind] = {"params": {n: p.detach().clone() for n, p in net.named_parameters()}}
    return results


def _shipped_hook_state(name: str, net: nn.Module) -> tuple[Any, Callable[..., Any], Any]:
    """``(state, hook, model averager or None)`` for one of the hooks torch ships."""
    from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import optimizer_overlap_hooks as overlap
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as local_sgd
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as power_sgd
    from torch.distributed.algorithms.ddp_comm_hooks import quantization_hooks as quant
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import _FunctionalSGD

    if name in ("powerSGD", "batched_powerSGD"):
        state = power_sgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=2,
            start_powerSGD_iter=2,
            min_compression_rate=0.5,
            use_error_feedback=True,
            warm_start=True,
            random_seed=3,
        )
        hook = power_sgd.powerSGD_hook if name == "powerSGD" else power_sgd.batched_powerSGD_hook
        return state, hook, None
    if name == "quantization_pertensor":
        return None, quant.quantization_pertensor_hook, None
    if name == "quantization_perchannel":
        return None, quant.quantization_perchannel_hook, None
    if name == "post_localSGD":
        subgroup, _ = dist.new_subgroups(group_size=1)
        state = local_sgd.PostLocalSGDState(
            process_group=None, subgroup=subgroup, start_localSGD_iter=2
        )
        return state, local_sgd.post_localSGD_hook, PeriodicModelAverager(period=2, warmup_steps=2)
    if name == "noop":
        return None, debugging_hooks.noop_hook, None
    if name == "hook_then_optimizer":
        functional = _FunctionalSGD([], lr=0.05, _allow_empty_param_list=True)
        optim_state = overlap._OptimizerHookState(functional, None)
        return None, overlap._hook_then_optimizer(torch_hooks.allreduce_hook, optim_state), None
    raise KeyError(name)


def shipped_hook(name: str) -> dict[str, Any]:
    """One of torch's own comm hooks registered on both DDPs (world-size-dependent math)."""
    rank = dist.get_rank()
    torch.manual_seed(7 + rank)
    base = Net()
    results = {}
    for kind, ddp_cls in (("torch", TorchDDP), ("ferrodist", _ferrodist_side()[0])):
        net = copy.deepcopy(base)
        # PowerSGD issues collectives from future callbacks: with several buckets their order
        # differs across ranks and gloo hangs, under torch's DDP as under ours; one bucket here
        cap = 25 if "powerSGD" in name else 0.01
        wrapped = ddp_cls(net, bucket_cap_mb=cap)
        state, hook, averager = _shipped_hook_state(name, net)
        wrapped.register_comm_hook(state, hook)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.05)
        for x in _batches(rank, 5):
            wrapped(x).square().mean().backward()
            if name != "hook_then_optimizer":  # that hook has already stepped
                opt.step()
            if averager is not None:  # averages the parameters that have a gradient
                averager.average_parameters(list(net.parameters()))
            opt.zero_grad()
        results[kind] = {"params": {n: p.detach().clone() for n, p in net.named_parameters()}}
    return results


def delayed_all_reduce() -> dict[str, Any]:
    """``delay_all_reduce_named_params``: the output layer reduced in one asynchronous
    all-reduce when ``inp.weight``'s gradient is computed (the hook runs before that gradient is
    accumulated, so a delayed parameter must be done by then: the output layer is); a barrier
    after backward orders it before the step (torch never waits for it)."""
    rank = dist.get_rank()
    torch.manual_seed(7 + rank)
    base = Net()
    results = {}
    for kind, ddp_cls in (("torch", TorchDDP), ("ferrodist", _ferrodist_side()[0])):
        net = copy.deepcopy(base)
        delayed = [(n, p) for n, p in net.named_parameters() if n.startswith("out.")]
        wrapped = ddp_cls(
            net,
            # An int: torch before 2.13 hands bucket_cap_mb to _broadcast_coalesced as the
            # buffer size on this path, and a float there is a TypeError.
            bucket_cap_mb=1,
            delay_all_reduce_named_params=delayed,
            param_to_hook_all_reduce=net.inp.weight,
        )
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
        for x in _batches(rank, 4):
            wrapped(x).square().mean().backward()
            dist.barrier()
            opt.step()
            opt.zero_grad()
        results[kind] = {"params": {n: p.detach().clone() for n, p in net.named_parameters()}}
    return results


#: torch's own hooks checked through :func:`shipped_hook`.
SHIPPED_HOOKS = (
    "powerSGD",
    "post_localSGD",
    "noop",
    "hook_then_optimizer",
)


def _compare(res: dict[str, Any]) -> dict[str, Any]:
    t, f = res["torch"], res["ferrodist"]
    diffs = {n: (t["params"][n] - f["params"][n]).abs().max().item() for n in t["params"]}
    return {
        "bitwise": all(torch.equal(t["params"][n], f["params"][n]) for n in t["params"]),
        "buffers_bitwise": all(
            torch.equal(t["buffers"][n], f["buffers"][n]) for n in t.get("buffers", {})
        ),
        "max_diff": max(diffs.values(), default=0.0),
        "torch_layout": t.get("layout", []),
        "ferrodist_layout": f.get("layout", []),
        "rebuilt": (t.get("rebuilt"), f.get("rebuilt")),
        "ferrodist_params": {n: p.tolist() for n, p in f["params"].items()},
    }


#: name -> zero-argument scenario; the test module asserts on each one's comparison.
SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "default": lambda: run(ddp={"bucket_cap_mb": 0.01}),
    "allreduce_hook_layout": lambda: run(
        ddp={"bucket_cap_mb": 0.01}, hook="allreduce_hook", record=True
    ),
    "unused_find": lambda: run(
        model={"unused": True},
        ddp={"find_unused_parameters": True, "bucket_cap_mb": 0.01},
        spare_on_rank=1,
        hook="allreduce_hook",
        record=True,
    ),
    "unused_everywhere": lambda: run(
        model={"unused": True}, ddp={"find_unused_parameters": True}, spare_on_rank=None
    ),
    "tied_and_buffers": lambda: run(model={"tied": True, "bn": True}, ddp={"bucket_cap_mb": 0.01}),
    "no_sync": lambda: run(ddp={"bucket_cap_mb": 0.01}, no_sync_every=2, steps=6),
    "bucket_view_no_sync": lambda: run(
        model={"bn": True},
        ddp={"bucket_cap_mb": 0.01, "gradient_as_bucket_view": True},
        no_sync_every=2,
        steps=6,
        zero_grad_to_none=False,
    ),
    "bucket_view_unused": lambda: run(
        model={"unused": True},
        ddp={"gradient_as_bucket_view": True, "find_unused_parameters": True},
        spare_on_rank=0,
    ),
    "static_graph": lambda: run(
        model={"unused": True},
        ddp={"static_graph": True, "bucket_cap_mb": 0.01},
        hook="allreduce_hook",
        record=True,
        steps=5,
    ),
    "fp16_compress": lambda: run(ddp={"bucket_cap_mb": 0.01}, hook="fp16_compress_hook"),
    "fp16_wrapper_swapped": lambda: run(
        ddp={"bucket_cap_mb": 0.01, "gradient_as_bucket_view": True},
        hook="fp16_compress_wrapper",
        swap_hooks=True,
    ),
    # large gradients, copied into their buckets as they arrive
    "wide": lambda: run(model={"wide": True, "bn": True}, ddp={"bucket_cap_mb": 0.1}),
    "wide_bucket_view": lambda: run(
        model={"wide": True}, ddp={"bucket_cap_mb": 0.1, "gradient_as_bucket_view": True}
    ),
    "wide_bucket_view_zeroed_no_sync": lambda: run(
        model={"wide": True},
        ddp={"bucket_cap_mb": 0.1, "gradient_as_bucket_view": True},
        no_sync_every=2,
        steps=6,
        zero_grad_to_none=False,
    ),
    "wide_hook_bucket_view": lambda: run(
        model={"wide": True},
        ddp={"gradient_as_bucket_view": True},
        hook="allreduce_hook",
        record=True,
    ),
    "wide_unused_find": lambda: run(
        model={"wide": True, "unused": True},
        ddp={"find_unused_parameters": True, "bucket_cap_mb": 0.1},
        spare_on_rank=1,
    ),
    # half types: every gradient multiplied by 1/3 in the bucket as torch does (1/3 is not a
    # half-precision number: rounding it first gives other bits)
    "wide_fp16": lambda: run(model={"wide": True}, ddp={"bucket_cap_mb": 0.1}, dtype=torch.float16),
    "bf16_unused_find": lambda: run(
        model={"unused": True},
        ddp={"bucket_cap_mb": 0.01, "find_unused_parameters": True},
        spare_on_rank=1,
        dtype=torch.bfloat16,
    ),
    "wide_static_graph": lambda: run(
        model={"wide": True, "tied": True},
        ddp={"static_graph": True, "gradient_as_bucket_view": True},
        steps=5,
    ),
    "delayed_all_reduce": delayed_all_reduce,
    "subgroup": subgroup,
    "join_uneven": uneven_join,
    "join_uneven_dynamic_divisor": lambda: uneven_join(divide_by_initial_world_size=False),
    "fused_optimizer": fused_optimizer,
    "builtin_allreduce": lambda: builtin_hook("ALLREDUCE"),
    "builtin_fp16": lambda: builtin_hook("FP16_COMPRESS"),
}


#: name -> scenario run on the sides named; each side in a world of its own (module doc).
SPARSE_SCENARIOS: dict[str, Callable[[tuple[str, ...]], dict[str, Any]]] = {
    "sparse": lambda sides: run(model={"sparse": True}, ddp={"bucket_cap_mb": 0.01}, sides=sides),
    "sparse_hook": lambda sides: run(
        model={"sparse": True},
        ddp={"bucket_cap_mb": 0.01},
        hook="allreduce_hook",
        record=True,
        sides=sides,
    ),
    "sparse_find_unused": lambda sides: run(
        model={"sparse": True, "unused": True},
        ddp={"find_unused_parameters": True},
        spare_on_rank=1,
        sides=sides,
    ),
}


def torch_sparse_sides() -> bytes:
    """torch's side of every sparse scenario, pickled: run in a world without ferrodist."""
    return pickle.dumps({name: fn(("torch",))["torch"] for name, fn in SPARSE_SCENARIOS.items()})


def compare_sparse(ferrodist_sides: bytes, torch_sides: bytes) -> dict[str, Any]:
    """Each sparse scenario's comparison, from the two worlds' pickled sides."""
    ours, theirs = pickle.loads(ferrodist_sides), pickle.loads(torch_sides)
    return {name: _compare({"torch": theirs[name], "ferrodist": ours[name]}) for name in ours}


def run_all() -> dict[str, Any]:
    """Every scenario plus the two error texts, compared, and ferrodist's side of the sparse
    scenarios, pickled (``sparse_sides``); what one rank reports."""
    out: dict[str, Any] = {name: _compare(fn()) for name, fn in SCENARIOS.items()}
    out["sparse_sides"] = pickle.dumps(
        {name: fn(("ferrodist",))["ferrodist"] for name, fn in SPARSE_SCENARIOS.items()}
    )
    for name in SHIPPED_HOOKS:
        out[f"shipped_{name}"] = _compare(shipped_hook(name))
    out["mismatch_error"] = mismatch_error()
    out["unused_error"] = unused_without_detection()
    return out
