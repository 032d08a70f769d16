"""Rendezvous through etcd with real processes: ``init_process_group(init_method="etcd://...")``
(ferrodist's and torch's own, which finds the scheme ferrodist registers), ``ferrodist.rendezvous``
and ``torchrun --rdzv-backend=ferrodist-etcd`` found through the ``torchrun.handlers`` entry
point that pyproject.toml declares."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as tdist
from _procs import PACKAGE_ROOT, env, finish, spawn
from etcd_support import EtcdCluster

import ferrodist
from ferrodist.rdzv.etcd_url import parse_etcd_url

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

WORLD = 2

WORKER = """
import sys
from datetime import timedelta
import torch
import ferrodist
rank, url, which = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist = ferrodist if which == "ferrodist" else torch.distributed
dist.init_process_group("gloo", init_method=url, rank=rank, world_size=int(sys.argv[4]),
                        timeout=timedelta(seconds=60))
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} sum {int(total.item())}", flush=True)
dist.destroy_process_group()
"""

TORCHRUN_WORKER = """
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} sum {int(total.item())}", flush=True)
dist.destroy_process_group()
"""


def _expected(world: int) -> list[str]:
    return [f"rank {r} sum {sum(range(1, world + 1))}" for r in range(world)]


@pytest.mark.parametrize("which", ["ferrodist", "torch"])
def test_init_process_group_with_an_etcd_url(
    etcd_cluster: EtcdCluster, etcd_prefix: str, which: str
) -> None:
    url = f"etcd://{etcd_cluster.endpoints}/{etcd_prefix}"
    procs = [spawn(WORKER, str(rank), url, which, str(WORLD)) for rank in range(WORLD)]
    outputs = finish(procs, timeout=120)
    assert sorted(out.strip().splitlines()[-1] for out in outputs) == _expected(WORLD)
    store = ferrodist.EtcdStore(etcd_cluster.endpoints, etcd_prefix, timedelta(seconds=10))
    assert store.num_keys() > 0, "the rendezvous went through etcd"
    store.purge()


def test_ferrodist_rendezvous_yields_an_etcd_store_once(
    etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    url = f"etcd://{etcd_cluster.endpoints}/{etcd_prefix}"
    handed = ferrodist.rendezvous(url, rank=0, world_size=1, timeout=timedelta(seconds=10))
    store, rank, world_size = next(handed)
    assert isinstance(store, ferrodist.EtcdStore) and (rank, world_size) == (0, 1)
    assert store.prefix == etcd_prefix and store.endpoints == etcd_cluster.endpoint_list()
    with pytest.raises(RuntimeError, match="re-rendezvous"):
        next(handed)
    # torch's dispatcher takes the scheme too.
    store, _, _ = next(tdist.rendezvous(url, rank=0, world_size=1))
    assert isinstance(store, ferrodist.EtcdStore)


def test_etcd_urls_are_read_with_torchs_errors() -> None:
    endpoints, job, kwargs = parse_etcd_url(
        "etcd://root@h1:2379,h2:2379/job-1?rank=0&ca_file=/ca.pem&world_size=2"
        "&password_file=/pw&insecure_plaintext_credentials=0"
    )
    assert endpoints == ["h1:2379", "h2:2379"] and job == "job-1"
    assert kwargs == {
        "username": "root",
        "ca_file": "/ca.pem",
        "password_file": "/pw",
        "insecure_plaintext_credentials": False,
    }
    with pytest.raises(ValueError, match="etcd:// rendezvous: a job name is missing"):
        next(ferrodist.rendezvous("etcd://h1:2379", rank=0, world_size=1))
    with pytest.raises(ValueError, match="etcd:// rendezvous: no etcd endpoints"):
        next(ferrodist.rendezvous("etcd:///job", rank=0, world_size=1))
    with pytest.raises(ValueError, match="rank parameter missing"):
        next(ferrodist.rendezvous("etcd://h1:2379/job"))


def _entry_point_dist(root: Path) -> Path:
    """A distribution whose metadata holds pyproject.toml's ``torchrun.handlers`` entry point
    (an installed ferrodist has the same), so torch's registry discovers it as it would."""
    pyproject = (Path(PACKAGE_ROOT).parent / "pyproject.toml").read_text()
    section = re.search(
        r'\[project\.entry-points\."torchrun\.handlers"\]\n((?:[^\[\n].*\n)+)', pyproject
    )
    assert section is not None, "pyproject.toml declares the torchrun handler"
    info = root / "ferrodist_entry_points-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: ferrodist-entry-points\nVersion: 0\n"
    )
    lines = [line.replace('"', "") for line in section.group(1).splitlines() if "=" in line]
    (info / "entry_points.txt").write_text("[torchrun.handlers]\n" + "\n".join(lines) + "\n")
    return root


def test_torchrun_with_the_ferrodist_etcd_backend(
    etcd_cluster: EtcdCluster, etcd_prefix: str, tmp_path: Path
) -> None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    script = tmp_path / "worker.py"
    script.write_text(TORCHRUN_WORKER)
    environment = env()
    metadata = _entry_point_dist(tmp_path / "site")
    environment["PYTHONPATH"] = f"{metadata}:{environment['PYTHONPATH']}"
    run = subprocess.run(
        [
            torchrun,
            "--nnodes=1",
            f"--nproc-per-node={WORLD}",
            "--rdzv-backend=ferrodist-etcd",
            f"--rdzv-endpoint={etcd_cluster.endpoints}",
            f"--rdzv-id={etcd_prefix}",
            f"--rdzv-conf=prefix={etcd_prefix}",
            "--max-restarts=0",
            "--monitor-interval=0.1",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env=environment,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    for expected in _expected(WORLD):
        assert expected in run.stdout, (run.stdout, run.stderr[-4000:])
    state = ferrodist.EtcdStore(
        etcd_cluster.endpoints, f"{etcd_prefix}/{etcd_prefix}", timedelta(seconds=10)
    )
    assert f"torch.rendezvous.{etcd_prefix}" in state.list_keys(), "the agents met in etcd"
    state.purge()
