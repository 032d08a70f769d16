"""FSDP prefetching, two real gloo processes (see _fsdp_prefetch_worker): with
``BACKWARD_PRE`` the next unit's all-gather is issued before the current unit's backward compute
begins, with ``BACKWARD_POST`` before its reduce-scatter, with ``forward_prefetch`` before the
current unit's forward compute ends, and with neither, never ahead. Numbers are unchanged by any
of it: the parity tests of test_fsdp.py run with torch's default, ``BACKWARD_PRE``."""

from __future__ import annotations

import pytest
from _fsdp_prefetch_worker import SCENARIOS
from _scenario_world import scenario_results

WORLD = 2


@pytest.fixture(scope="module")
def results() -> dict[str, list[str]]:
    return scenario_results("_fsdp_prefetch_worker", list(SCENARIOS), WORLD)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_gathers_are_issued_ahead_as_configured(
    results: dict[str, list[str]], scenario: str
) -> None:
    assert results[scenario] == ["PASS"] * WORLD, results[scenario]
