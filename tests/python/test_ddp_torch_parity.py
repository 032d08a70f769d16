"""ferrodist's DDP against torch's own DDP, step by step, in a gloo world of two processes.

``skip_all_reduce_unused_params`` (buckets whose parameters a rank left unused are not
reduced, with and without a comm hook, bucket views, a static graph) and sparse gradients with
``gradient_as_bucket_view`` (torch's test_sparse_gradients_grad_is_view, through a comm hook
too, mixed with dense buckets, accumulating). The scenarios live in
_ddp_torch_parity_worker.py; each asserts that gradients and parameters are bitwise torch's
after every step, and that the Logger counts the same reduced buckets.
"""

from __future__ import annotations

import pytest
from _ddp_torch_parity_worker import SCENARIOS
from _scenario_world import scenario_results

WORLD = 2


@pytest.fixture(scope="module")
def results() -> dict[str, list[str]]:
    """Run every scenario once in one world; ``{scenario: [outcome per rank]}``."""
    return scenario_results("_ddp_torch_parity_worker", list(SCENARIOS), WORLD)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_matches_torch_ddp_bitwise(results: dict[str, list[str]], scenario: str) -> None:
    assert results[scenario] == ["PASS"] * WORLD, results[scenario]
