"""Completion of asynchronous ops: the works the recorder waits to see finish.

Completion is polled (``Work.is_completed``), oldest first, at the next recorded op and by the
watchdog before it judges, rather than signalled by a callback on the work's future: such a
callback would take the GIL on the backend's own thread for every op, the cost ferrodist's
reducer avoids on purpose. Works that cannot be polled cheaply (``_unobservable``) are asked
only by the watchdog's sweep; the per-op sweep marks them by what it already knows. A late mark
only moves ``completed_at``; it can never make a finished op look pending to the watchdog,
which sweeps first. Point-to-point works (``hold_p2p``) are never marked by what later ops did:
a receive may wait through any number of collectives.

A held work keeps its future, and an unfinished future its callbacks (DDP's hold the reducer and
so the process group), so works are let go of as soon as they are seen finished, and all of
them when the default group ends, at exit and in a forked child (``forget``).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Optional

__all__ = [
    "abandon_after_fork",
    "completed",
    "forget",
    "futureless",
    "hold",
    "hold_p2p",
    "pending",
    "short",
    "sweep",
    "sweep_before_record",
    "waited",
    "watch",
]

_in_flight: dict[int, Any] = {}
"""Recorded asynchronous works not yet seen finished, in the order they were issued."""

_unobservable: dict[int, Any] = {}
"""Works seen unfinished that have no future. Most still report ``is_completed`` (gloo's sends
and receives), but gloo's reduce-scatters (every variant, torch 2.4 to 2.15) return one whose
``is_completed`` stays False after ``wait``. Such an op counts as completed once it says so, once
its waiter says so (``waited``), or once an op recorded after it has completed; until then it is
pending, so a reduce-scatter that really hangs is still reported. Kept apart so that the per-op
sweep does not stop at one, and not asked on every op: asking costs a Python call per work
(ferrodist's exchanges are such works, a send and a receive each), about a tenth of what FSDP's
ops cost to record on small units."""

_latest_completed = 0
"""The highest id known completed."""

_p2p: dict[int, Optional[Callable[[Any], None]]] = {}
"""Held point-to-point ops, each with what to call with its work once it is seen finished,
before it is marked (a receive from any source learns its sender there: ``Work._source_rank``)."""

_p2p_unobservable: dict[int, Any] = {}
"""Point-to-point works seen unfinished that have no future (gloo's sends and receives). Unlike a
collective's, such an op may finish long after ops issued later have (a receive waits through
barriers), so none counts as completed because a later op did: each is asked (``is_completed``,
which they answer) on every recorded op while it is held (a pipeline holds a few), by the
watchdog's full sweep, or marked when its issuer waits for it."""


def short(error: BaseException) -> str:
    """One line naming ``error``, for the ring."""
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(error).__name__}: {first}"[:300]


def watch(rec: Any, ident: int, work: Any) -> None:
    """Mark ``ident`` started now, and completed (or failed) once ``work`` has finished."""
    rec.started(ident)
    hold(ident, work)


def hold(ident: int, work: Any) -> None:
    """Mark ``ident`` (already started) completed or failed once ``work`` has finished."""
    _in_flight[ident] = work


def hold_p2p(
    ident: int,
    work: Any,
    on_finished: Optional[Callable[[Any], None]] = None,
    asks_future: bool = True,
) -> None:
    """Mark the point-to-point op ``ident`` (already started) completed or failed once
    ``work`` has finished, calling ``on_finished(work)`` (if given) first. ``asks_future``
    False: a work known to have no future (gloo's sends and receives, where asking raises, at
    15-25 µs a time), polled by ``is_completed`` alone from the start."""
    _p2p[ident] = on_finished
    if asks_future:
        _in_flight[ident] = work
    else:
        _p2p_unobservable[ident] = work


def _finished_with(rec: Any, ident: int, work: Any) -> None:
    """Mark ``ident`` completed, its finished ``work`` at hand."""
    if _p2p:
        hook = _p2p.pop(ident, None)
        if hook is not None:
            try:
                hook(work)
            except Exception:  # naming the sender must never fail the op
                pass
    completed(rec, ident)


_observable: dict[int, Any] = {}
"""In-flight works already found to have a future, by id, with that future: the head of the
queue is checked on every recorded op while it runs, and asking (a pybind call, an exception
when there is none) once per work is enough; the future is kept for reading how it ended."""


_futureless: set[type] = set()
"""Work classes known to have no future (``futureless``): asking one raises, a Python exception
made and caught on each of FSDP's all-gathers held past the next op (a quarter of a microsecond
timed alone, several in place), so they are set aside without asking."""


def futureless(cls: type) -> type:
    """Class decorator: works of ``cls`` have no future (``get_future`` raises RuntimeError, as
    gloo's do); the recorder sets them aside without asking."""
    _futureless.add(cls)
    return cls


def _set_aside(ident: int, work: Any) -> bool:
    """Move an unfinished work without a future to ``_unobservable``; True if moved."""
    if ident in _observable:
        return False
    if type(work) not in _futureless:
        try:
            _observable[ident] = work.get_future()
            return False
        except RuntimeError:  # "Work::getFuture not implemented"
            pass
    if _in_flight.pop(ident, None) is not None:
        (_p2p_unobservable if ident in _p2p else _unobservable)[ident] = work
    return True


def completed(rec: Any, ident: int) -> None:
    """Mark ``ident`` completed in ``rec``: the unobservable ops issued before it did too."""
    global _latest_completed
    rec.completed(ident)
    if ident > _latest_completed:
        _latest_completed = ident
        if _unobservable:
            _mark_overtaken(rec)


def waited(rec: Any, work: Any) -> None:
    """``work`` was waited for by its issuer: mark its op completed if the recorder holds it."""
    for held_by in (_unobservable, _p2p_unobservable, _in_flight):
        for ident, held in list(held_by.items()):
            if held is work:
                held_by.pop(ident, None)
                _observable.pop(ident, None)
                _finished_with(rec, ident, work)
                return


def pending() -> bool:
    return bool(_in_flight) or bool(_unobservable) or bool(_p2p_unobservable)


def _sweep_unobservable(rec: Any) -> None:
    for ident, work in list(_unobservable.items()):
        if ident < _latest_completed or _finished(work):
            if _unobservable.pop(ident, None) is not None:
                completed(rec, ident)
    if _p2p_unobservable:
        _poll_p2p(rec)


def _poll_p2p(rec: Any) -> None:
    for ident, work in list(_p2p_unobservable.items()):
        if _finished(work) and _p2p_unobservable.pop(ident, None) is not None:
            _finished_with(rec, ident, work)


def _mark_overtaken(rec: Any) -> None:
    """Mark the unobservable ops issued before the latest completed one, oldest first (they
    were set aside in issue order, so this stops at the first one not overtaken)."""
    while _unobservable:
        try:
            ident = next(iter(_unobservable))
        except (StopIteration, RuntimeError):  # another thread swept meanwhile
            return
        if ident >= _latest_completed:
            return
        if _unobservable.pop(ident, None) is not None:
            rec.completed(ident)


def sweep_before_record(rec: Any) -> None:
    """The sweep every recorded op makes first: of the in-flight works, those that have
    finished, stopping at the first one still running (ops finish mostly in order, so this costs
    O(1) amortized); of the unobservable works, only those a later completed op has overtaken
    (of point-to-point ones, those that say they have finished). Nothing held: two checks.

    On the path of every op, so a work is asked whether it finished here rather than through
    ``_finished``: each Python call saved is a few per cent of what recording an op costs."""
    if _unobservable:
        _mark_overtaken(rec)
    if _p2p_unobservable:
        _poll_p2p(rec)
    while _in_flight:
        try:
            ident = next(iter(_in_flight))
            work = _in_flight[ident]
        except (StopIteration, KeyError, RuntimeError):  # another thread swept meanwhile
            return
        try:
            finished = work.is_completed()
        except RuntimeError:
            finished = True
        if not finished:
            if _set_aside(ident, work):
                continue
            return
        _mark(rec, ident, work)


def sweep(rec: Any, everything: bool = True) -> None:
    """Mark the in-flight works that have finished (``everything`` False: as
    ``sweep_before_record``)."""
    if not everything:
        sweep_before_record(rec)
        return
    if _unobservable or _p2p_unobservable:
        _sweep_unobservable(rec)
    for ident, work in list(_in_flight.items()):
        if _finished(work):
            _mark(rec, ident, work)
        else:
            _set_aside(ident, work)
    if _unobservable or _p2p_unobservable:
        _sweep_unobservable(rec)


def _finished(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except RuntimeError:
        return True


def _mark(rec: Any, ident: int, work: Any) -> None:
    if _in_flight.pop(ident, None) is None:
        return  # another thread marked it
    error = _work_error(work, _observable.pop(ident, None))
    if error is None:
        _finished_with(rec, ident, work)
    else:
        _p2p.pop(ident, None)
        rec.failed(ident, error)


def _work_error(work: Any, fut: Any = None) -> Optional[str]:
    """Why a finished work failed, or None (its future's value re-raises the error;
    ``Work.exception`` is deprecated); ``fut``: its future, when already asked for."""
    if fut is None:
        if type(work) in _futureless:
            return None  # its wait() is where an error surfaces
        try:
            fut = work.get_future()
        except Exception:  # a Work without a future: its wait() is where an error surfaces
            return None
    try:
        fut.value()
    except Exception as e:
        return short(e)
    return None


def forget(rec: Any) -> None:
    """Mark what has finished, then let go of every work still held."""
    if rec is not None:
        sweep(rec)
    _in_flight.clear()
    _unobservable.clear()
    _p2p_unobservable.clear()
    _observable.clear()
    _p2p.clear()


def abandon_after_fork() -> None:
    """In a forked child: drop the parent's works without ever freeing them. Freeing one could
    end the parent's process group here, whose destructor waits on backend threads the child
    does not have; the child keeps them, unreachable, for its lifetime."""
    global _latest_completed
    _latest_completed = 0
    _observable.clear()
    _p2p.clear()
    for held in (_in_flight, _unobservable, _p2p_unobservable):
        if held:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(dict(held)))
            held.clear()
