"""The native per-parameter DDP hook over the iteration plan: what it reports, what it calls
back, and when not."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

from ferrodist import _native


class Owner:
    """Stands in for the Reducer: records every callback."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def launch(self, first: int, end: int, finish: bool, reduce_used_map: bool) -> None:
        self.calls.append(("launch", first, end, finish, reduce_used_map))

    def copy(self, index: int, param: torch.Tensor) -> None:
        self.calls.append(("copy", index, param))

    def twice(self, index: int) -> BaseException:
        return RuntimeError(f"parameter {index} twice")


def _plan(
    buckets: list[list[int]], copied: tuple[int, ...] = (), find_unused: bool = False
) -> _native.DdpIteration:
    count = sum(map(len, buckets))
    return _native.DdpIteration(
        buckets,
        [i in copied for i in range(count)],
        find_unused=find_unused,
        skip_unused=False,
    )


def _hook(plan: _native.DdpIteration, index: int, owner: Owner) -> Any:
    return _native.GradientHook(
        plan, index, owner, launch=Owner.launch, ready_twice=Owner.twice, copy=Owner.copy
    )


def test_buckets_launch_in_order_once_complete_and_copies_come_first() -> None:
    owner, param = Owner(), torch.zeros(2)
    plan = _plan([[0, 1], [2]], copied=(1,))
    plan.begin_backward([])
    hooks = [_hook(plan, i, owner) for i in range(3)]
    hooks[2](param)  # bucket 1 is complete but waits for bucket 0
    assert owner.calls == []
    hooks[0](param)
    hooks[1](param)
    assert owner.calls == [("copy", 1, param), ("launch", 0, 2, True, False)]
    assert plan.buckets_reduced == 2


def test_hooks_outside_an_armed_backward_call_nothing() -> None:
    owner, param = Owner(), torch.zeros(2)
    plan = _plan([[0]], copied=(0,))
    hook = _hook(plan, 0, owner)
    hook(param)  # before any begin_backward (no_sync, or a backward DDP did not prepare)
    plan.begin_backward([])
    hook(param)
    plan.finish_backward()
    hook(param)
    assert owner.calls == [("copy", 0, param), ("launch", 0, 1, True, False)]


def test_find_unused_launches_unused_buckets_and_asks_for_the_used_map() -> None:
    owner, param = Owner(), torch.zeros(2)
    plan = _plan([[1], [0]], find_unused=True)
    assert plan.searches_unused()
    plan.begin_backward([1])
    _hook(plan, 0, owner)(param)
    assert owner.calls == [("launch", 0, 2, True, True)]
    assert plan.may_have_unused()


def test_a_second_report_raises_the_owners_error() -> None:
    owner = Owner()
    plan = _plan([[0, 1]])
    plan.begin_backward([])
    hook = _hook(plan, 0, owner)
    hook(torch.zeros(1))
    with pytest.raises(RuntimeError, match=r"^parameter 0 twice$"):
        hook(torch.zeros(1))
    assert plan.unfinished() == [1]


def test_a_hook_whose_owner_is_gone_reports_nothing() -> None:
    owner = Owner()
    plan = _plan([[0]], copied=(0,))
    plan.begin_backward([])
    hook = _hook(plan, 0, owner)
    del owner
    gc.collect()
    hook(torch.zeros(1))
    assert plan.unfinished() is None


def test_a_layout_that_misses_a_parameter_is_refused() -> None:
    with pytest.raises(ValueError, match="exactly once"):
        _native.DdpIteration([[0]], [False, False], find_unused=False, skip_unused=False)
