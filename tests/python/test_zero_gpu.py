"""ZeroRedundancyOptimizer with CUDA parameters (two processes sharing a GPU over gloo, which
moves CUDA tensors for broadcasts): parity with torch, bucket views on CUDA, and consolidation
of CUDA state through the CPU transport gloo needs."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

import ferrodist.optim as fopt


def _worker(rank: int, world: int, tmp: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world)
    from _zero_workers import assert_state_dicts_equal, batch, make_model, param_groups

    try:
        for bucket_view in (False, True):
            models = [make_model().cuda(), make_model().cuda()]
            opts = [
                cls(
                    param_groups(m),
                    torch.optim.Adam,
                    parameters_as_bucket_view=bucket_view,
                    lr=0.01,
                )
                for cls, m in zip((fopt.ZeroRedundancyOptimizer, TorchZero), models)
            ]
            for step in range(3):
                x, y = (t.cuda() for t in batch(100 * rank + step))
                for m, o in zip(models, opts):
                    m.zero_grad()
                    torch.nn.functional.mse_loss(m(x), y).backward()
                    o.step()
            for p, q in zip(*(m.parameters() for m in models)):
                assert p.is_cuda and torch.equal(p, q)
            for o in opts:
                o.consolidate_state_dict(to=0)
            if rank == 0:
                assert_state_dicts_equal(opts[0].state_dict(), opts[1].state_dict())
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_cuda_parameters_match_torch(tmp_path) -> None:
    mp.spawn(_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
