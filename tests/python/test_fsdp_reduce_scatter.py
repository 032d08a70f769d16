"""FSDP's all-gather and reduce-scatter on gloo composed of receives and sends posted first (the
link's rate both ways, and half the bytes of gloo's own reduce-scatter): taken by default at two
ranks and equal to gloo's bit for bit there; opt-in at three, equal to rounding (see
_fsdp_reduce_scatter_worker)."""

from __future__ import annotations

import pytest
from _scenario_world import scenario_results


@pytest.mark.parametrize("world", [2, 3])
def test_the_composed_reduce_scatter_is_used_and_equals_gloos(world: int) -> None:
    results = scenario_results("_fsdp_reduce_scatter_worker", ["composed"], world)
    assert results["composed"] == ["PASS"] * world, results
