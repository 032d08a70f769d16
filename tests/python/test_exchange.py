"""The collectives composed of receives posted before sends (``ferrodist._exchange``): gloo's
bits for all-gather, reduce-scatter rows and broadcasts (NaN payloads and -0.0 included), two in
flight at once, on a subgroup; ZeRO's steps by exchange at two ranks by default and at three
when asked (see _exchange_worker)."""

from __future__ import annotations

import pytest
from _scenario_world import scenario_results


@pytest.mark.parametrize("world", [2, 3])
def test_exchanges_equal_gloos_collectives(world: int) -> None:
    results = scenario_results("_exchange_worker", ["collectives", "zero"], world)
    assert results == {"collectives": ["PASS"] * world, "zero": ["PASS"] * world}, results
