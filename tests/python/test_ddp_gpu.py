"""ferrodist's DDP on CUDA with NCCL (one process, one GPU); skipped where there is no GPU.

The same training on torch's DDP and ferrodist's must give bit-identical parameters (mixed
precision aside: torch 2.11's is wrong on CUDA, see its test), and
torch's ZeRO overlap hook (``hook_with_zero_step``, NCCL only) must run on ferrodist's DDP the
way it runs on torch's: it reads ``_has_rebuilt_buckets`` and the GradBucket methods.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ferrodist.algorithms.ddp_comm_hooks import default_hooks
from ferrodist.nn import DistributedDataParallel as FerroDDP


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.Linear(64, 4)
    ).cuda()


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("hook", [None, "allreduce_hook", "fp16_compress_hook"])
def test_cuda_training_matches_torch(nccl_world: object, hook: str | None) -> None:
    base = _model()
    final = {}
    for kind, cls in (("torch", TorchDDP), ("ferrodist", FerroDDP)):
        net = copy.deepcopy(base)
        ddp = cls(net, device_ids=[0], bucket_cap_mb=0.01, find_unused_parameters=True)
        if hook is not None:
            ddp.register_comm_hook(None, getattr(default_hooks, hook))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        for _ in range(4):
            ddp(torch.randn(8, 32, generator=g)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        final[kind] = [p.detach().cpu() for p in net.parameters()]
    for a, b in zip(final["torch"], final["ferrodist"]):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("interleaved", [False, True])
def test_torch_zero_overlap_hook_runs_on_ferrodist_ddp(
    nccl_world: object, interleaved: bool
) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import ddp_zero_hook
    from torch.distributed.optim import ZeroRedundancyOptimizer

    make_hook = (
        ddp_zero_hook.hook_with_zero_step_interleaved
        if interleaved
        else ddp_zero_hook.hook_with_zero_step
    )

    base = _model()
    final = {}
    for kind, cls in (("torch", TorchDDP), ("ferrodist", FerroDDP)):
        net = copy.deepcopy(base)
        ddp = cls(net, device_ids=[0])
        zero = ZeroRedundancyOptimizer(
            ddp.parameters(), torch.optim.SGD, overlap_with_ddp=True, lr=0.1
        )
        ddp.register_comm_hook(None, make_hook(default_hooks.allreduce_hook, ddp, zero))
        g = torch.Generator().manual_seed(2)
        for _ in range(5):
            ddp(torch.randn(8, 32, generator=g)).square().mean().backward()
        final[kind] = [p.detach().cpu() for p in net.parameters()]
    moved = any(not torch.equal(a, b.cpu()) for a, b in zip(final["ferrodist"], base.parameters()))
    assert moved, "ZeRO must have stepped after its two warm-up iterations"
    for a, b in zip(final["torch"], final["ferrodist"]):
        assert torch.equal(a, b)


def _fp16_compute_fp32_weights(base: torch.nn.Module, steps: int) -> list[torch.Tensor]:
    """What DDP mixed precision means at world 1, written out: an fp16 copy of the model
    computes, its gradients are cast up, and SGD steps the fp32 weights."""
    net = copy.deepcopy(base)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    for _ in range(steps):
        low = copy.deepcopy(net).half()
        low(torch.randn(8, 32, generator=g).cuda().half()).float().square().mean().backward()
        for p, q in zip(net.parameters(), low.parameters()):
            p.grad = q.grad.float()
        opt.step()
        opt.zero_grad()
    return [p.detach().cpu() for p in net.parameters()]


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("reduce_dtype", [None, torch.float32])
def test_cuda_mixed_precision_trains_fp16_with_fp32_weights(
    nccl_world: object, reduce_dtype: object
) -> None:
    """Not bitwise against torch here: torch 2.11's private ``_MixedPrecision`` on CUDA hands
    the optimizer each parameter's own values as its gradient (the first step's gradient norm
    equals the weight norm, so SGD just shrinks the weights by ``lr``), found on an H200. The
    first forward must still match torch's, and training must match the written-out rule."""
    from torch.nn.parallel.distributed import _MixedPrecision

    cfg = _MixedPrecision(param_dtype=torch.float16, reduce_dtype=reduce_dtype)
    base = _model()
    first_loss = {}
    final = []
    for kind, cls in (("torch", TorchDDP), ("ferrodist", FerroDDP)):
        net = copy.deepcopy(base)
        ddp = cls(net, device_ids=[0], mixed_precision=cfg)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(3)
        for step in range(4):
            loss = ddp(torch.randn(8, 32, generator=g).cuda()).float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step == 0:
                first_loss[kind] = loss.detach().cpu()
        torch.cuda.synchronize()
        final = [p.detach().cpu() for p in net.parameters()]
    assert torch.equal(first_loss["torch"], first_loss["ferrodist"])
    for ours, expected in zip(final, _fp16_compute_fp32_weights(base, 4)):
        assert ours.dtype == torch.float32
        assert torch.equal(ours, expected)


def _gloo_cuda_worker(rank: int, world: int, init_file: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.cuda.set_device(0)
        base = _model()
        final = {}
        for kind, cls in (("torch", TorchDDP), ("ferrodist", FerroDDP)):
            net = copy.deepcopy(base)
            ddp = cls(net, device_ids=[0], bucket_cap_mb=0.01)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            g = torch.Generator().manual_seed(10 + rank)
            for _ in range(3):
                ddp(torch.randn(8, 32, generator=g).cuda()).square().mean().backward()
                opt.step()
                opt.zero_grad()
            final[kind] = [p.detach().cpu() for p in net.parameters()]
        for a, b in zip(final["torch"], final["ferrodist"]):
            assert torch.equal(a, b), f"rank {rank}: parameters differ from torch's DDP"
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.timeout(180)
def test_two_processes_drive_cuda_tensors_over_gloo(tmp_path: object) -> None:
    """One GPU, two ranks: gloo reduces the CUDA gradients; every parameter is torch's."""
    import torch.multiprocessing as mp

    mp.start_processes(
        _gloo_cuda_worker,
        args=(2, f"{tmp_path}/init"),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
