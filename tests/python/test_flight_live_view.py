"""``ferrodist-store --metrics-addr`` shows a real job's flight recorder (issue 28 item 4): a
2-rank gloo job whose ranks are clients of the standalone server (torchrun's agent-store mode)
publishes its watchdog summaries there, and ``GET /flight`` and ``GET /metrics`` name both
ranks' last completed collective and its call site."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from _procs import env, finish
from tcp_support import StoreServer

JOB = """\
import time
import torch
import ferrodist as dist

dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)  # the last op
time.sleep(1.0)  # several watchdog periods: the summary after the last op is published
dist.destroy_process_group()
"""


def fetch(addr: str, path: str) -> str:
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def test_a_real_jobs_ranks_show_their_last_completed_op_on_the_servers_page(
    tmp_path: Path,
) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    line = next(i for i, text in enumerate(JOB.splitlines(), 1) if "# the last op" in text)
    server = StoreServer("--metrics-addr", "127.0.0.1:0")
    try:
        assert server.proc.stdout is not None
        announced = server.proc.stdout.readline().strip()
        metrics_addr = announced.removeprefix("ferrodist-store metrics on http://")
        metrics_addr = metrics_addr.removesuffix("/metrics")
        ranks = []
        for rank in range(2):
            rank_env = env()
            rank_env.update(
                RANK=str(rank),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(server.port),
                # every rank is a client of the server that is already there, as under torchrun
                TORCHELASTIC_USE_AGENT_STORE="True",
                FERRODIST_HANG_THRESHOLD_S="0.4",  # a watchdog period of 0.1 s
            )
            ranks.append(
                subprocess.Popen(
                    [sys.executable, str(script)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=rank_env,
                )
            )
        finish(ranks, timeout=90)

        page = fetch(metrics_addr, "/flight")
        assert "job (no prefix): 2 rank(s)" in page, page
        done = re.findall(
            rf"^  rank (\d): heartbeat .*\n    last completed: all_reduce #(\d+) on (\S+) "
            rf"at job\.py:{line}, ",
            page,
            re.MULTILINE,
        )
        assert sorted(r for r, _, _ in done) == ["0", "1"], page
        assert len({(seq, group) for _, seq, group in done}) == 1, page
        seq, group = done[0][1], done[0][2]
        assert "malformed summaries skipped: 0" in page, page

        metrics = fetch(metrics_addr, "/metrics")
        for rank in ("0", "1"):
            sample = (
                f'ferrodist_flight_last_completed_seq{{job_prefix="",rank="{rank}",'
                f'group="{group}"}} {seq}'
            )
            assert sample in metrics.splitlines(), metrics
            assert f'ferrodist_flight_pending_ops{{job_prefix="",rank="{rank}"}} 0' in metrics
    finally:
        server.stop()
