"""``ferrodist.all_reduce`` of a sparse tensor on gloo against torch's, bit for bit.

ferrodist sums a sparse tensor with dense all-gathers of its own (``ferrodist._sparse_all_reduce``)
instead of gloo's sparse all-reduce, which corrupts the heap now and then beside a Rust extension
(README, DDP table). Each side runs the same cases in a world of three processes (three, so a
wrong summation order would show): torch's in a world that never loads ferrodist, ferrodist's in
another. The reduced tensors must match to the bit (indices, values, coalesced flag), as must the
``Work`` of an asynchronous call and the errors' classes and texts.
"""

from __future__ import annotations

from typing import Any

import pytest
from _sparse_all_reduce_cases import CASES
from _torch_only_world import torch_only_results, world_results

WORLD = 3


@pytest.fixture(scope="module")
def sides() -> tuple[dict[int, Any], dict[int, Any]]:
    """``(torch's, ferrodist's)`` outcomes, ``{rank: {case: outcome}}``."""
    theirs = torch_only_results("_sparse_all_reduce_cases", "torch_side", WORLD)
    ours = world_results(
        "_sparse_all_reduce_cases", "ferrodist_side", WORLD, without_ferrodist=False
    )
    return theirs, ours


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES)
def test_the_same_outcome_as_torchs_gloo_sparse_all_reduce(
    sides: tuple[dict[int, Any], dict[int, Any]], case: str
) -> None:
    theirs, ours = sides
    for rank in range(WORLD):
        assert ours[rank][case] == theirs[rank][case], f"rank {rank}"


@pytest.mark.timeout(300)
def test_the_cases_reduce_something_and_fail_where_torch_fails(
    sides: tuple[dict[int, Any], dict[int, Any]],
) -> None:
    """The comparison above is not between two empty or two failed runs."""
    theirs, _ = sides
    first = theirs[0]
    assert len(first["embedding_rows"]["indices"][0]) > 10  # rows from every rank
    assert first["embedding_rows"]["coalesced"] is True
    assert first["one_rank_empty"]["values"] and first["all_empty"]["values"] == []
    assert first["async"]["async"] == {
        "wait": True,
        "completed": True,
        "future_holds_the_input": True,
    }
    assert first["max_is_refused"]["error"][0] == "RuntimeError"  # torch's own refusal
    assert "SUM" in first["max_is_refused"]["error"][1]
    assert first["in_a_coalescing_block"]["error"][0] == "NotImplementedError"  # torch 2.13
    assert first["sizes_differ"]["error"] == ("RuntimeError", "Sparse dimensions do not match")


@pytest.mark.timeout(300)
def test_recorded_as_one_all_reduce_per_call(sides: tuple[dict[int, Any], dict[int, Any]]) -> None:
    """The flight recorder sees the user's call, not the all-gathers it is made of."""
    _, ours = sides
    for rank in range(WORLD):
        assert ours[rank]["recorded_ops"] == ["all_reduce"] * len(CASES), f"rank {rank}"


@pytest.mark.timeout(300)
def test_ferrodists_ddp_never_starts_gloos_sparse_all_reduce() -> None:
    """What torch's profiler sees DDP start on a model with a sparse embedding: torch's DDP
    starts gloo's sparse all-reduce (so the probe sees it), ferrodist's only dense works."""
    theirs = torch_only_results("_sparse_all_reduce_cases", "torch_ddp_gloo_works", WORLD)
    ours = world_results(
        "_sparse_all_reduce_cases", "ferrodist_ddp_gloo_works", WORLD, without_ferrodist=False
    )
    for rank in range(WORLD):
        assert "gloo:sparse_all_reduce" in theirs[rank], theirs[rank]
        assert "gloo:sparse_all_reduce" not in ours[rank], ours[rank]
        assert {"gloo:all_gather", "gloo:all_reduce"} <= set(ours[rank]), ours[rank]
