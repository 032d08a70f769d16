"""The flight recorder on NCCL (one GPU, world 1); marked ``gpu``, skipped without CUDA.

On NCCL a synchronous collective returns once its op is enqueued on the stream, so an op stuck on
the GPU would look completed if completion were marked on return. These tests keep the stream
busy (``torch.cuda._sleep``) and check that an op stays pending until the device has run it, and
that DDP's and FSDP's NCCL traffic is recorded, tagged and completed, and dumped for the doctor.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as tdist
from _procs import env

import ferrodist as dist
import ferrodist.debug
from ferrodist.debug import _recorder

pytestmark = pytest.mark.gpu

_BUSY_CYCLES = 2_000_000_000
"""About a second of one GPU thread spinning (the H100's clock is near 2 GHz)."""


@pytest.fixture
def nccl_group(leaves_no_group: None) -> Iterator[Any]:
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=tdist.HashStore(), rank=0, world_size=1, device_id=0)
    try:
        yield ferrodist.debug.recorder()
    finally:
        dist.destroy_process_group()


def _settled(rec: Any) -> list[dict[str, Any]]:
    torch.cuda.synchronize()
    _recorder.sweep()
    return list(rec.entries())


@pytest.mark.timeout(120)
def test_a_synchronous_nccl_op_stays_pending_until_the_gpu_has_run_it(nccl_group: Any) -> None:
    rec = nccl_group
    x = torch.ones(4, device="cuda")
    torch.cuda._sleep(_BUSY_CYCLES)
    dist.all_reduce(x)  # returns with the op queued behind the busy stream
    last = rec.entries()[-1]
    assert (last["op"], last["state"], last["shapes"]) == ("all_reduce", "started", [[4]])
    assert last["completed_at_ms"] is None, last
    after = _settled(rec)[-1]
    assert (after["seq"], after["state"]) == (last["seq"], "completed"), after
    assert torch.equal(x, torch.ones(4, device="cuda"))  # the sum over one rank


@pytest.mark.timeout(120)
def test_an_asynchronous_nccl_op_completes_when_its_work_has_run(nccl_group: Any) -> None:
    rec = nccl_group
    x = torch.arange(6.0, device="cuda")
    torch.cuda._sleep(_BUSY_CYCLES)
    work = dist.broadcast(x, src=0, async_op=True)
    assert rec.entries()[-1]["state"] == "started"
    work.wait()
    assert [e["state"] for e in _settled(rec)][-1] == "completed"


@pytest.mark.timeout(180)
def test_ddp_and_fsdp_nccl_traffic_is_recorded_tagged_and_completed(nccl_group: Any) -> None:
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from ferrodist.fsdp import FullyShardedDataParallel as FerroFSDP
    from ferrodist.nn import DistributedDataParallel as FerroDDP

    rec = nccl_group

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    ddp = FerroDDP(model().cuda(), device_ids=[0])
    fsdp = FerroFSDP(model(), auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}), device_id=0)
    for wrapped in (ddp, fsdp):
        for _ in range(3):
            wrapped(torch.randn(8, 16, device="cuda")).square().mean().backward()
    entries = _settled(rec)
    ops = Counter(e["op"] for e in entries)
    assert ops["ddp.all_reduce"] >= 3, ops
    assert ops["fsdp.all_reduce"] >= 3, ops  # FULL_SHARD at world 1 runs as NO_SHARD, as torch
    assert [e for e in entries if e["state"] != "completed"] == []


@pytest.mark.timeout(120)
def test_an_nccl_ring_dumps_and_the_doctor_finds_no_hang(nccl_group: Any, tmp_path: Any) -> None:
    x = torch.ones(3, device="cuda")
    for _ in range(4):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    path = ferrodist.debug.dump(str(tmp_path))
    assert path == str(tmp_path / "rank0.json")
    dumped = json.loads((tmp_path / "rank0.json").read_text())
    assert [e["op"] for e in dumped["entries"]][-4:] == ["all_reduce"] * 4
    assert {e["state"] for e in dumped["entries"]} == {"completed"}
    done = subprocess.run(
        [sys.executable, "-m", "ferrodist.doctor", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        env=env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["behind"], report["desyncs"], report["gone"]) == ([], [], [])
