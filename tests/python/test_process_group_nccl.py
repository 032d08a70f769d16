"""Process groups over NCCL (CUDA). Marked ``gpu``: skipped where no CUDA device is present.

On one GPU a world of one runs in-process; with two or more GPUs, two real processes compare
ferrodist's collectives with torch's on the same inputs, PREMUL_SUM running natively in NCCL.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as tdist

import ferrodist as dist

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(120)
def test_world_of_one_on_nccl_matches_torch():
    dist.init_process_group("nccl", store=tdist.HashStore(), rank=0, world_size=1, device_id=0)
    try:
        assert dist.get_backend() == "nccl"
        x = torch.arange(8.0, device="cuda")
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist._make_nccl_premul_sum(2.0)):
            ours, theirs = x.clone(), x.clone()
            dist.all_reduce(ours, op=op)
            tdist.all_reduce(theirs, op=op)
            assert torch.equal(ours, theirs), op
        # torch's NCCL at world 1 copies the input and skips the pre-multiplication: the same.
        ours, theirs = torch.empty(8, device="cuda"), torch.empty(8, device="cuda")
        work = dist.reduce_scatter_tensor(
            ours, x, op=dist._make_nccl_premul_sum(3.0), async_op=True
        )
        work.wait()
        tdist.reduce_scatter_tensor(theirs, x, op=dist._make_nccl_premul_sum(3.0))
        assert torch.equal(ours, theirs)
    finally:
        dist.destroy_process_group()


_TWO_RANKS = textwrap.dedent(
    """
    import sys, torch, torch.distributed as tdist, ferrodist as dist
    rank, port = int(sys.argv[1]), sys.argv[2]
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, device_id=rank)
    x = torch.arange(6.0, device="cuda") + rank
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG,
               dist._make_nccl_premul_sum(0.5)):
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, op=op); tdist.all_reduce(b, op=op)
        assert torch.equal(a, b), op
    a, b = torch.empty(12, device="cuda"), torch.empty(12, device="cuda")
    dist.all_gather_into_tensor(a, x); tdist.all_gather_into_tensor(b, x)
    assert torch.equal(a, b)
    a, b = x.clone(), x.clone()
    dist.broadcast(a, 1); tdist.broadcast(b, 1)
    assert torch.equal(a, b)
    dist.barrier()
    dist.destroy_process_group()
    print("OK", rank)
    """
)


@pytest.mark.timeout(180)
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_ranks_on_nccl_match_torch(free_port: int):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _TWO_RANKS, str(r), str(free_port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outs = [p.communicate(timeout=160) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"OK {r}" in out, err[-3000:]
