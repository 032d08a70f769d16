"""The demo trains for real: two processes rendezvous over the embedded tcp:// store, say who
joined, and the printed loss falls."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ferrodist import demo


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_demo_prints_who_joined_and_the_loss_falls():
    args = ["--world-size", "2", "--steps", "16", "--log-every", "5"]
    proc = subprocess.run(
        [sys.executable, "-m", "ferrodist.demo", *args],
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    out = proc.stdout
    assert "2 joined" in out and "tcp://" in out
    assert re.search(r"rank 0: pid \d+", out) and re.search(r"rank 1: pid \d+", out)
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", out)]
    assert len(losses) == 4, out  # steps 0, 5, 10 and 15 (the last)
    assert losses[-1] < 0.8 * losses[0], losses


def test_choice_tables_cover_what_exists_now():
    assert sorted(demo.OPTIMIZERS) == ["adam", "sgd"]
    assert sorted(demo.DDP_WRAPPERS) == ["torch"]
    import torch

    params = [torch.nn.Parameter(torch.zeros(2))]
    assert isinstance(demo.OPTIMIZERS["adam"](params, 0.1), torch.optim.Adam)
    with pytest.raises(SystemExit):
        demo._parse(["--optimizer", "zero"])  # not plugged in yet
