"""The native per-parameter DDP hook: what it reports, what it calls back, and when not."""

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

    def launch(self, first: int, end: int, all_launched: bool) -> None:
        self.calls.append(("launch", first, end, all_launched))

    def arrived(self, index: int, param: torch.Tensor) -> None:
        self.calls.append(("arrived", index, param))

    def twice(self, index: int) -> BaseException:
        return RuntimeError(f"parameter {index} twice")


def _armed(buckets: list[list[int]]) -> _native.Readiness:
    readiness = _native.Readiness(sum(map(len, buckets)), buckets)
    readiness.arm(
        armed=True,
        record_used=False,
        count_only=False,
        use_hook_counts=False,
        record_rebuild=False,
        unused=[],
    )
    return readiness


def _hook(readiness: _native.Readiness, index: int, owner: Owner, arrival: bool) -> Any:
    return _native.GradientHook(
        readiness,
        index,
        owner,
        launch=Owner.launch,
        ready_twice=Owner.twice,
        on_arrival=Owner.arrived if arrival else None,
    )


def test_buckets_launch_in_order_once_complete_and_arrivals_come_first() -> None:
    owner, param = Owner(), torch.zeros(2)
    readiness = _armed([[0, 1], [2]])
    hooks = [_hook(readiness, i, owner, arrival=i == 1) for i in range(3)]
    hooks[2](param)  # bucket 1 is complete but waits for bucket 0
    assert owner.calls == []
    hooks[0](param)
    hooks[1](param)
    assert owner.calls == [("arrived", 1, param), ("launch", 0, 2, True)]


def test_a_second_report_raises_the_owners_error() -> None:
    owner = Owner()
    readiness = _armed([[0, 1]])
    hook = _hook(readiness, 0, owner, arrival=False)
    hook(torch.zeros(1))
    with pytest.raises(RuntimeError, match=r"^parameter 0 twice$"):
        hook(torch.zeros(1))


def test_a_hook_whose_owner_is_gone_reports_nothing() -> None:
    owner = Owner()
    readiness = _armed([[0]])
    hook = _hook(readiness, 0, owner, arrival=True)
    del owner
    gc.collect()
    hook(torch.zeros(1))
    assert not readiness.any_ready()
