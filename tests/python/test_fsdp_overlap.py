"""Optimizer overlap for ferrodist's FSDP (torch's ``register_fsdp`` raises), two real gloo
processes: each configuration of _fsdp_overlap_worker must end bit-identical to stepping after
backward; torch's own FSDP is still refused with torch's ``NotImplementedError``."""

from __future__ import annotations

import os
import socket

import pytest
import torch
from _fsdp_overlap_worker import CONFIGS
from _procs import finish, spawn

from ferrodist.algorithms._optimizer_overlap.optimizer_overlap import _as_overlapped_optim

WORLD = 2
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def results() -> dict[str, list[str]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        f"import sys; sys.path.insert(0, {HERE!r}); import _fsdp_overlap_worker as w; "
        "w.main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))"
    )
    outputs = finish([spawn(code, str(r), str(WORLD), str(port)) for r in range(WORLD)], 180)
    out: dict[str, list[str]] = {name: [] for name in CONFIGS}
    for text in outputs:
        for line in text.splitlines():
            if line.startswith("RESULT "):
                _, name, outcome = line.split(" ", 2)
                out[name].append(outcome)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_overlapped_steps_equal_stepping_after_backward(
    results: dict[str, list[str]], config: str
) -> None:
    assert results[config] == ["PASS"] * WORLD, results[config]


def test_torchs_fsdp_is_still_refused() -> None:
    overlapped = _as_overlapped_optim(torch.optim.SGD, [torch.nn.Parameter(torch.ones(2))], lr=1)
    with pytest.raises(NotImplementedError, match="does not support overlapped FSDP"):
        overlapped.register_fsdp(object())
