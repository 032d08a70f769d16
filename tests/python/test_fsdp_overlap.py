"""Optimizer overlap for ferrodist's FSDP (torch's ``register_fsdp`` raises), two real gloo
processes: each configuration of _fsdp_overlap_worker must end bit-identical to stepping after
backward; torch's own FSDP is still refused with torch's ``NotImplementedError``."""

from __future__ import annotations

import pytest
import torch
from _fsdp_overlap_worker import CONFIGS
from _scenario_world import scenario_results

from ferrodist.algorithms._optimizer_overlap.optimizer_overlap import _as_overlapped_optim

WORLD = 2


@pytest.fixture(scope="module")
def results() -> dict[str, list[str]]:
    """Run every scenario once in one world; ``{scenario: [outcome per rank]}``."""
    return scenario_results("_fsdp_overlap_worker", list(CONFIGS), WORLD)


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
