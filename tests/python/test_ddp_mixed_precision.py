"""DDP's ``mixed_precision`` (torch's ``_MixedPrecision``) on gloo with two real processes.

torch's own implementation needs CUDA (the GPU parity test is in test_ddp_gpu.py), so here each
rank checks ferrodist's DDP bitwise against the documented arithmetic done by hand on a plain
copy of the model (see _ddp_mp_worker.py): losses, full-precision gradients, the state after
several optimizer steps, buffers, ``no_sync`` accumulation, unused parameters and the errors.
"""

from __future__ import annotations

import pytest
from _ddp_mp_worker import SCENARIOS
from _scenario_world import scenario_results

WORLD = 2


@pytest.fixture(scope="module")
def results() -> dict[str, list[str]]:
    """Run every scenario once in one world; ``{scenario: [outcome per rank]}``."""
    return scenario_results("_ddp_mp_worker", list(SCENARIOS), WORLD)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_mixed_precision_scenario(results: dict[str, list[str]], scenario: str) -> None:
    assert results[scenario] == ["PASS"] * WORLD, results[scenario]
