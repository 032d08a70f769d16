"""Process groups across real processes: ferrodist vs torch.distributed on gloo.

One world of 3 processes (``_pg_worker.py``) runs every section; spawning dominates the cost, so
the world is started once per module and each test reads its section's report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORLD = 3
SECTIONS = [
    "rendezvous",
    "collectives",
    "premul_sum",
    "round_robin",
    "wrapper_detail",
    "monitored_barrier",
]
WORKER = Path(__file__).with_name("_pg_worker.py")


def _free_port_block() -> int:
    """A port p with p, p+1 and p+2 free a moment ago (the worker uses all three)."""
    import socket

    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 2 >= 65535:
            continue
        try:
            for p in (port + 1, port + 2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no block of 3 free ports")


def run_world(world: int, tmp_path: Path, timeout_s: float = 150) -> list[str]:
    """Run the worker on ``world`` ranks; return each rank's stdout. Kills them on timeout."""
    port = _free_port_block()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), str(world), str(port), str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(world)
    ]
    outs, failures = [], []
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=timeout_s)
            if p.returncode != 0:
                failures.append(f"rank {r} exited {p.returncode}:\n{out}\n{err[-3000:]}")
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert not failures, "\n".join(failures)
    return outs


@pytest.fixture(scope="module")
def world_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """{section: {rank: checks passed}} from one run of the 3-process world."""
    outs = run_world(WORLD, tmp_path_factory.mktemp("pg"))
    report: dict[str, Any] = {}
    for out in outs:
        for line in out.splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                report.setdefault(rec["section"], {})[rec["rank"]] = rec["checks"]
    return report


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("section", SECTIONS)
def test_section_passes_on_every_rank(world_report: dict[str, Any], section: str):
    ranks: dict[int, int] = world_report.get(section, {})
    assert sorted(ranks) == list(range(WORLD)), f"{section} did not finish on every rank"
    # every rank that takes part checked something (rank 1 only skips the failing barrier)
    assert all(n > 0 for r, n in ranks.items() if (section, r) != ("monitored_barrier", 1))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_collectives_checked_on_world_and_subgroup(world_report: dict[str, Any]):
    tables = world_report["tables"]
    # subgroup members ran the same table of checks as on the world; rank 1 is not a member
    for rank in (0, 2):
        assert tables[rank]["subgroup"] == tables[rank]["world"] > 0
    assert tables[1]["subgroup"] == 0 and tables[1]["world"] == tables[0]["world"]
