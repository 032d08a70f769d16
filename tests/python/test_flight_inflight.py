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


@_inflight.futureless
class _FuturelessWork(_UnobservableWork):
    """A work of a class declared without a future: asking for one fails the test."""

    def get_future(self) -> Any:
        raise AssertionError("a futureless work was asked for its future")


def test_a_work_of_a_futureless_class_is_set_aside_and_marked_without_asking(rec: Any) -> None:
    running = _FuturelessWork(finished=False)
    done = _FuturelessWork(finished=True)
    held = _issue(rec, "fsdp.all_gather")
    _inflight.hold(held, running)
    _inflight.sweep(rec, everything=False)  # unfinished at the head: set aside
    assert (running.asked, _state(rec, held)) == (1, "started")
    finished = _issue(rec, "fsdp.all_gather")
    _inflight.hold(finished, done)
    _inflight.sweep(rec, everything=False)  # finished: marked, its error read without asking
    assert _state(rec, finished) == "completed"
    assert _state(rec, held) == "completed"  # overtaken by the later op's completion
    assert not _inflight.pending()


def test_ferrodists_exchange_is_a_futureless_work() -> None:
    from ferrodist._exchange import ExchangeWork

    assert ExchangeWork in _inflight._futureless
    with pytest.raises(RuntimeError, match="getFuture not implemented"):
        ExchangeWork([]).get_future()  # what torch's futureless works raise, for their users


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


def test_a_point_to_point_op_is_never_completed_by_a_later_op(rec: Any) -> None:
    """A receive waits through any number of collectives: only its own work says it is done."""
    work = _UnobservableWork(finished=False)
    held = _issue(rec, "p2p 0->1")
    _inflight.hold_p2p(held, work)
    _inflight.sweep(rec, everything=False)
    for _ in range(3):  # barriers issued and completed after it
        later = _issue(rec, "barrier")
        _inflight.sweep(rec, everything=False)
        _inflight.completed(rec, later)
    _inflight.sweep(rec)
    assert _state(rec, held) == "started"
    asked = work.asked
    work.finished = True
    _inflight.sweep(rec, everything=False)  # the next recorded op asks the few held
    assert work.asked == asked + 1
    assert _state(rec, held) == "completed"
    assert not _inflight.pending()


def test_a_receive_from_any_source_is_moved_before_it_is_marked(rec: Any) -> None:
    work = _UnobservableWork(finished=False)
    ident, _ = rec.record("WORLD:p2p:any->1", "p2p any->1", [[2]], ["float32"], None, "t.py:1")
    seen: list[tuple[str, str]] = []

    def sender_known(finished: Any) -> None:
        assert finished is work
        seen.append((_state(rec, ident), "moved"))
        rec.moved(ident, "WORLD:p2p:2->1", "p2p 2->1")

    _inflight.hold_p2p(ident, work, sender_known)
    _inflight.sweep(rec)
    assert seen == []
    work.finished = True
    _inflight.sweep(rec)
    assert seen == [("issued", "moved")]
    entry = next(e for e in rec.entries() if e["id"] == ident)
    assert (entry["group"], entry["seq"], entry["state"]) == ("WORLD:p2p:2->1", 1, "completed")


def test_a_gloo_point_to_point_work_is_polled_and_never_asked_for_a_future(rec: Any) -> None:
    """gloo's sends and receives have none: asking raises, at 15-25 us a time."""

    class _NoFuture(_UnobservableWork):
        futures_asked = 0

        def get_future(self) -> Any:
            self.futures_asked += 1
            return super().get_future()

    work = _NoFuture(finished=False)
    held = _issue(rec, "p2p 0->1")
    _inflight.hold_p2p(held, work, asks_future=False)
    _inflight.sweep(rec, everything=False)
    _inflight.sweep(rec)
    assert _state(rec, held) == "started"
    work.finished = True
    _inflight.sweep(rec, everything=False)
    assert _state(rec, held) == "completed"
    assert work.futures_asked == 0
    assert not _inflight.pending() and not _inflight._p2p
