"""The demo trains for real: two processes rendezvous over the embedded tcp:// store, say who
joined, and the printed loss falls; and every rank leaves cleanly, every time."""

from __future__ import annotations

import re

import pytest

from ferrodist import demo


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "choice",
    [
        ["--ddp", "ferrodist", "--optimizer", "zero"],
        ["--ddp", "torch", "--optimizer", "sgd"],
        ["--fsdp", "FULL_SHARD", "--optimizer", "adam"],
    ],
)
def test_demo_prints_who_joined_and_the_loss_falls(
    capfd: pytest.CaptureFixture[str], choice: list[str]
):
    # main() in this process (torch is already imported here); the ranks are real processes
    # whose output reaches our file descriptors
    status = demo.main(["--world-size", "2", "--steps", "16", "--log-every", "5", *choice])
    out, err = capfd.readouterr()
    assert status == 0, out + err[-3000:]
    assert "2 joined" in out and "tcp://" in out
    assert f"{choice[0]} {choice[1]} --optimizer {choice[3]}" in out
    assert re.search(r"rank 0: pid \d+", out) and re.search(r"rank 1: pid \d+", out)
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", out)]
    assert len(losses) == 4, out  # steps 0, 5, 10 and 15 (the last)
    assert losses[-1] < 0.8 * losses[0], losses


TEARDOWN_RUNS = 5
"""Demo runs in the teardown test. Before ferrodist._group_release, 10 of 130 runs of the reported
configuration (20 steps) aborted a rank at exit; test_group_release.py checks the cause itself."""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_demo_teardown_exits_cleanly_every_time(capfd: pytest.CaptureFixture[str]):
    # the configuration of the report (3 ranks, ZeRO), shortened: it is the exit that matters
    for run in range(TEARDOWN_RUNS):
        status = demo.main(["--world-size", "3", "--optimizer", "zero", "--steps", "2"])
        out, err = capfd.readouterr()
        assert status == 0, f"run {run}: " + out + err[-3000:]
        assert "failed" not in out, f"run {run}: " + out
        assert "terminate called" not in err and "Aborted" not in err, f"run {run}: " + err[-3000:]


def test_choice_tables_and_defaults():
    assert sorted(demo.OPTIMIZERS) == ["adam", "sgd", "zero"]
    assert sorted(demo.DDP_WRAPPERS) == ["ferrodist", "torch"]
    assert demo._parse([]).ddp == "ferrodist"
    assert demo._parse([]).fsdp is None
    assert demo._parse(["--fsdp", "SHARD_GRAD_OP"]).fsdp == "SHARD_GRAD_OP"
    with pytest.raises(SystemExit):
        demo._parse(["--optimizer", "lamb"])
    with pytest.raises(SystemExit):
        demo._parse(["--fsdp", "FULL_SHARD", "--optimizer", "zero"])
