"""Completion of asynchronous ops: the works the recorder waits to see finish.

Completion is polled (``Work.is_completed``), oldest first, at the next recorded op and by the
watchdog before it judges, rather than signalled by a callback on the work's future: such a
callback would take the GIL on the backend's own thread for every op, the cost ferrodist's
reducer avoids on purpose. A late mark only moves ``completed_at``; it can never make a finished
op look pending to the watchdog, which sweeps first.

A held work keeps its future, and an unfinished future its callbacks (DDP's hold the reducer and
so the process group), so works are let go of as soon as they are seen finished, and all of
them when the default group ends, at exit and in a forked child (``forget``).
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional

__all__ = ["abandon_after_fork", "forget", "hold", "pending", "short", "sweep", "watch"]

_in_flight: dict[int, Any] = {}
"""Recorded asynchronous works not yet seen finished, in the order they were issued."""


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


def pending() -> bool:
    return bool(_in_flight)


def sweep(rec: Any, everything: bool = True) -> None:
    """Mark the in-flight works that have finished; with ``everything`` False stop at the first
    one still running (ops finish mostly in order, so a per-op sweep costs O(1) amortized)."""
    if not everything:
        while _in_flight:
            try:
                ident = next(iter(_in_flight))
                work = _in_flight[ident]
            except (StopIteration, KeyError, RuntimeError):  # another thread swept meanwhile
                return
            if not _finished(work):
                return
            _mark(rec, ident, work)
        return
    for ident, work in list(_in_flight.items()):
        if _finished(work):
            _mark(rec, ident, work)


def _finished(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except RuntimeError:
        return True


def _mark(rec: Any, ident: int, work: Any) -> None:
    if _in_flight.pop(ident, None) is None:
        return  # another thread marked it
    error = _work_error(work)
    if error is None:
        rec.completed(ident)
    else:
        rec.failed(ident, error)


def _work_error(work: Any) -> Optional[str]:
    """Why a finished work failed, or None (its future's value re-raises the error;
    ``Work.exception`` is deprecated)."""
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


def abandon_after_fork() -> None:
    """In a forked child: drop the parent's works without ever freeing them. Freeing one could
    end the parent's process group here, whose destructor waits on backend threads the child
    does not have; the child keeps them, unreachable, for its lifetime."""
    if _in_flight:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(dict(_in_flight)))
        _in_flight.clear()
