"""One rank of the DDP mixed-precision world started by test_ddp_mixed_precision.py.

torch's DDP mixed precision needs CUDA, so on CPU the reference is the arithmetic torch
documents, done by hand on a plain copy of the model: parameters cast to ``param_dtype`` for the
forward and backward, each gradient cast to ``reduce_dtype`` (else kept), summed across ranks,
divided by the world size, and written into a full-precision ``.grad`` before the optimizer
steps on the full-precision weights. Every scenario prints ``RESULT name PASS`` or
``RESULT name FAIL why``.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch
import torch.distributed as dist
from _scenario_world import run_scenarios
from torch.nn.parallel.distributed import _MixedPrecision

from ferrodist.nn import DistributedDataParallel as DDP

STEPS = 3


class Net(torch.nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.b = torch.nn.Linear(16, 4)
        self.unused = torch.nn.Linear(4, 4) if unused else None
        self.register_buffer("scale", torch.full((4,), 1.5))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.norm(self.a(x)))) * self.scale


def make(unused: bool = False) -> Net:
    torch.manual_seed(0)
    return Net(unused)


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(100 * step + rank))


def reference_grads(ref: Net, x: torch.Tensor, cfg: Any, world: int) -> torch.Tensor:
    """The documented arithmetic on a plain module; returns the loss."""
    fulls = [p.data for p in ref.parameters()]
    low = cfg.param_dtype
    if low is not None:
        for p in ref.parameters():
            p.data = p.data.to(low)
        x = x.to(low)
    loss = ref(x).float().square().mean()
    loss.backward()
    for p, full in zip(ref.parameters(), fulls):
        if p.grad is None:
            p.data = full
            continue
        grad = p.grad.to(cfg.reduce_dtype or p.grad.dtype)
        dist.all_reduce(grad)
        grad.div_(world)
        p.data = full
        p.grad = grad.to(full.dtype)
    return loss


def train_and_compare(cfg: Any, optim: Callable[..., torch.optim.Optimizer], **kw: Any) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    unused = kw.get("find_unused_parameters", False)
    net, ref = make(unused), make(unused)
    if cfg.buffer_dtype is not None:
        ref.scale.data = ref.scale.to(cfg.buffer_dtype)
    ddp = DDP(net, mixed_precision=cfg, **kw)
    opt, ropt = optim(net.parameters()), optim(ref.parameters())
    for step in range(STEPS):
        x = batch(step, rank)
        loss = ddp(x).float().square().mean()
        loss.backward()
        rloss = reference_grads(ref, x, cfg, world)
        assert torch.equal(loss, rloss), f"step {step}: loss {loss} != {rloss}"
        for (name, p), q in zip(net.named_parameters(), ref.parameters()):
            assert p.dtype == torch.float32, f"{name} left in {p.dtype}"
            if q.grad is None:
                assert p.grad is None, f"{name}: unused parameter got a gradient"
                continue
            assert p.grad is not None and p.grad.dtype == torch.float32, name
            assert torch.equal(p.grad, q.grad), f"step {step} {name}: gradients differ"
        opt.step()
        ropt.step()
        opt.zero_grad()
        ropt.zero_grad()
    for a, b in zip(net.state_dict().values(), ref.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b), "final state differs"


def scenario_fp16_reduce_fp32() -> None:
    cfg = _MixedPrecision(torch.float16, torch.float32, torch.float16)
    train_and_compare(cfg, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))


def scenario_bf16_reduce_in_bf16() -> None:
    cfg = _MixedPrecision(param_dtype=torch.bfloat16)
    train_and_compare(cfg, lambda ps: torch.optim.Adam(ps, lr=0.01))


def scenario_fp16_reduce_fp16_small_buckets() -> None:
    cfg = _MixedPrecision(torch.float16, torch.float16, None)
    train_and_compare(cfg, lambda ps: torch.optim.SGD(ps, lr=0.1), bucket_cap_mb=0.0005)


def scenario_reduce_dtype_only() -> None:
    cfg = _MixedPrecision(reduce_dtype=torch.float16)
    train_and_compare(cfg, lambda ps: torch.optim.SGD(ps, lr=0.1))


def scenario_unused_parameter() -> None:
    cfg = _MixedPrecision(torch.float16, torch.float32, None)
    train_and_compare(cfg, lambda ps: torch.optim.SGD(ps, lr=0.1), find_unused_parameters=True)


def scenario_buffers_and_eval() -> None:
    net = make()
    ddp = DDP(net, mixed_precision=_MixedPrecision(torch.float16, None, torch.float16))
    assert net.scale.dtype == torch.float16, "a float buffer is cast to buffer_dtype"
    assert net.count.dtype == torch.long, "an integer buffer keeps its dtype"
    with torch.no_grad():
        out = ddp(batch(0, 0))
    assert out.dtype == torch.float16, "the forward computes in param_dtype"
    dtypes = {v.dtype for k, v in net.state_dict().items() if k not in ("scale", "count")}
    assert dtypes == {torch.float32}, f"parameters after a no-grad forward: {dtypes}"


def scenario_no_sync_accumulates() -> None:
    cfg = _MixedPrecision(torch.float16, torch.float32, None)
    rank, world = dist.get_rank(), dist.get_world_size()
    net, ref = make(), make()
    ddp = DDP(net, mixed_precision=cfg)
    with ddp.no_sync():
        ddp(batch(0, rank)).float().square().mean().backward()
    assert {p.grad.dtype for p in net.parameters()} == {torch.float16}, "no_sync keeps low"
    ddp(batch(1, rank)).float().square().mean().backward()
    # reference: both backwards accumulate in float16, then one reduction
    fulls = [p.data for p in ref.parameters()]
    for p in ref.parameters():
        p.data = p.data.half()
    for step in (0, 1):
        ref(batch(step, rank).half()).float().square().mean().backward()
    for p, full in zip(ref.parameters(), fulls):
        grad = p.grad.float()
        dist.all_reduce(grad)
        p.data, p.grad = full, grad.div_(world)
    for p, q in zip(net.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad), "accumulated gradients differ"


def scenario_second_hook_refused() -> None:
    ddp = DDP(make(), mixed_precision=_MixedPrecision(torch.float16))
    try:
        ddp.register_comm_hook(None, lambda state, bucket: None)
    except RuntimeError as e:
        assert "can only be called once" in str(e), str(e)
    else:
        raise AssertionError("a second comm hook was accepted")


def scenario_bad_config() -> None:
    for bad in ("fp16", _MixedPrecision(param_dtype="float16")):  # type: ignore[arg-type]
        try:
            DDP(make(), mixed_precision=bad)
        except TypeError as e:
            assert "mixed_precision" in str(e), str(e)
        else:
            raise AssertionError(f"{bad!r} was accepted")


SCENARIOS = {
    name[len("scenario_") :]: fn for name, fn in globals().items() if name.startswith("scenario_")
}


def main(rank: int, world: int, port: int) -> None:
    run_scenarios(rank, world, port, SCENARIOS)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
