"""torch's own rendezvous paths against a running ``ferrodist-store``, with real processes:
``init_process_group(init_method="tcp://...")`` and torchrun's c10d rendezvous backend."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from tcp_support import ferrodist_store

import ferrodist

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]

WORLD = 2

WORKER = """
import os, sys
from datetime import timedelta
import torch
import torch.distributed as dist
if len(sys.argv) > 1:
    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=int(sys.argv[3]), timeout=timedelta(seconds=60))
else:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} sum {int(total.item())}", flush=True)
dist.destroy_process_group()
"""


def _expected_lines() -> list[str]:
    total = sum(range(1, WORLD + 1))
    return [f"rank {r} sum {total}" for r in range(WORLD)]


def _keys_on(port: int) -> list[str]:
    return ferrodist.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=10)).list_keys()


def test_init_process_group_tcp_url_against_ferrodist_store() -> None:
    # torch's agent-store mode: every rank is a client of the running server (rank 0 does not
    # try to host one). torch 2.15 honours it only for the agent's own MASTER_ADDR:MASTER_PORT,
    # which torchrun exports alongside it, as it does the restart count.
    with ferrodist_store() as server:
        env = {
            **os.environ,
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(server.port),
            "TORCHELASTIC_RESTART_COUNT": "0",  # torch 2.4 reads it in this mode
        }
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(rank), str(server.port), str(WORLD)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for rank in range(WORLD)
        ]
        try:
            outputs = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs:
                p.kill()
        for p, (_, err) in zip(procs, outputs):
            assert p.returncode == 0, err
        assert sorted(out.strip() for out, _ in outputs) == _expected_lines()
        assert _keys_on(server.port), "the rendezvous went through ferrodist-store"


def test_torchrun_c10d_rendezvous_against_ferrodist_store(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with ferrodist_store() as server:
        run = subprocess.run(
            [
                torchrun,
                "--nnodes=1",
                f"--nproc-per-node={WORLD}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{server.port}",
                "--rdzv-id=ferrodist-test",
                "--rdzv-conf=is_host=False",
                "--max-restarts=0",
                "--monitor-interval=0.1",
                str(script),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        # Both workers print to the one inherited stdout; match each line as a substring in
        # case their writes interleave.
        for expected in _expected_lines():
            assert expected in run.stdout, (run.stdout, run.stderr[-4000:])
        keys = _keys_on(server.port)
        assert any("ferrodist-test" in key for key in keys), keys
