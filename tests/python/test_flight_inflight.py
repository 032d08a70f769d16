"""Completion of asynchronous ops in the ring (``ferrodist.debug._inflight``): works that cannot
be polled cheaply (no future: gloo's reduce-scatters, sends and receives, ferrodist's exchanges)
are not asked on every recorded op, are marked completed once an op issued after them has
completed, and are still polled by the watchdog's full sweep; one issued after the latest
completed op stays pending."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ferrodist import _native
from ferrodist.debug import _inflight


class _UnobservableWork:
    """A work without a future whose ``is_completed`` is counted."""

    def __init__(self, finished: bool) -> None:
        self.finished = finished
        self.asked = 0

    def is_completed(self) -> bool:
        self.asked += 1
        return self.finished

    def get_future(self) -> Any:
        raise RuntimeError("Work::getFuture not implemented")


@pytest.fixture
def rec() -> Iterator[Any]:
    """A ring of its own; its ids start at 1 again, so the latest completed id starts at 0
    (and is put back afterwards, with the process's own ring's works let go of)."""
    recorder = _native.FlightRecorder(16)
    latest = _inflight._latest_completed
    _inflight.forget(None)
    _inflight._latest_completed = 0
    yield recorder
    _inflight.forget(None)
    _inflight._latest_completed = latest


def _issue(rec: Any, op: str) -> int:
    ident, _seq = rec.record("WORLD", op, [[2]], ["float32"], None, "test.py:1", started=True)
    return int(ident)


def _state(rec: Any, ident: int) -> str:
    return str(next(e["state"] for e in rec.entries() if e["id"] == ident))


def test_the_per_op_sweep_asks_an_unobservable_work_once_then_never_again(rec: Any) -> None:
    work = _UnobservableWork(finished=False)
    held = _issue(rec, "reduce_scatter")
    _inflight.hold(held, work)
    for _ in range(50):  # fifty later ops, each sweeping as it is recorded
        _inflight.sweep(rec, everything=False)
    assert work.asked == 1  # found unfinished at the head once, then set aside
    assert _state(rec, held) == "started"


def test_an_unobservable_op_completes_when_a_later_op_completes(rec: Any) -> None:
    work = _UnobservableWork(finished=False)  # gloo's reduce-scatter: never says it finished
    held = _issue(rec, "reduce_scatter")
    _inflight.hold(held, work)
    _inflight.sweep(rec, everything=False)
    later = _issue(rec, "all_reduce")
    assert _state(rec, held) == "started"
    _inflight.completed(rec, later)
    assert _state(rec, held) == "completed"
    assert not _inflight.pending()


def test_one_issued_after_the_latest_completed_op_stays_pending(rec: Any) -> None:
    earlier = _issue(rec, "all_reduce")
    _inflight.completed(rec, earlier)
    work = _UnobservableWork(finished=False)
    held = _issue(rec, "reduce_scatter")
    _inflight.hold(held, work)
    _inflight.sweep(rec, everything=False)
    _inflight.sweep(rec)
    assert _state(rec, held) == "started"  # a reduce-scatter that really hangs is still seen


def test_the_full_sweep_polls_unobservable_works(rec: Any) -> None:
    work = _UnobservableWork(finished=False)
    held = _issue(rec, "send")
    _inflight.hold(held, work)
    _inflight.sweep(rec, everything=False)
    work.finished = True  # a send that says when it has finished
    _inflight.sweep(rec, everything=False)
    assert _state(rec, held) == "started"  # not asked per op
    _inflight.sweep(rec)  # what the watchdog and dumps do before they read the ring
    assert _state(rec, held) == "completed"
