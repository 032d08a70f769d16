"""The process-wide flight recorder and the one path every recorded operation takes.

Why a ring per process, on by default: a hung job is diagnosed from what each rank last did, and
that history must already exist when the hang starts; it cannot be switched on afterwards. The
ring itself is ferrodist's Rust ``FlightRecorder`` (a fixed-size buffer behind one mutex, a push
per op); this module describes an operation (group, shapes, dtypes, reduce op: ``_describe``;
the user's call site: ``_call_site``), records it, and marks it started, completed (on return
for synchronous ops, once the returned ``Work`` has finished for asynchronous ones:
``_inflight``) or failed (when the watchdog runs, the failed op's error carries its diagnosis).

After ``fork`` the child starts with an empty recorder: the parent's mutex may have been held by
another thread at the moment of the fork.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any, Callable, Iterable, Optional

import torch
import torch.distributed.distributed_c10d as _c10d

from ferrodist import _native
from ferrodist.debug import _inflight
from ferrodist.debug._call_site import call_site, internal_call_site
from ferrodist.debug._describe import (
    any_source_channel,
    describe_group,
    p2p_channel,
    reduce_op_name,
)
from ferrodist.debug._inflight import short

__all__ = [
    "any_source_channel",
    "begin",
    "describe_group",
    "enabled",
    "fail",
    "finish_call",
    "forget_in_flight",
    "hold_until_finished",
    "p2p_channel",
    "queued_only",
    "received_from",
    "recorder",
    "run",
    "run_p2p",
    "short",
    "started",
    "sweep",
    "wait_launched",
    "waited",
    "watch",
]

_DEFAULT_SIZE = 2048


def _capacity_from_env() -> Optional[int]:
    """The ring's size, or None when ``FERRODIST_FLIGHT_RECORDER=0`` turns recording off."""
    if os.environ.get("FERRODIST_FLIGHT_RECORDER", "1").strip().lower() in ("0", "false", "off"):
        return None
    raw = os.environ.get("FERRODIST_FLIGHT_RECORDER_SIZE", "")
    try:
        size = int(raw) if raw.strip() else _DEFAULT_SIZE
    except ValueError:
        raise ValueError(
            f"FERRODIST_FLIGHT_RECORDER_SIZE must be a positive integer, got {raw!r}"
        ) from None
    if size <= 0:
        return None
    return size


class _State:
    """The recorder of this process, made on first use (never at import: a script that sets the
    environment variables after ``import ferrodist`` still gets what it asked for)."""

    recorder: Optional[_native.FlightRecorder] = None
    decided = False
    on_failure: Optional[Callable[[BaseException], Optional[str]]] = None
    """Set by the watchdog: the diagnosis to attach to a failed operation's error, if any."""


def recorder() -> Optional[_native.FlightRecorder]:
    """The process-wide recorder, or None when recording is off (``FERRODIST_FLIGHT_RECORDER=0``).

    Its capacity is ``FERRODIST_FLIGHT_RECORDER_SIZE`` (default 2048 operations).
    """
    if not _State.decided:
        size = _capacity_from_env()
        _State.recorder = None if size is None else _native.FlightRecorder(size)
        _State.decided = True
    return _State.recorder


def enabled() -> bool:
    return recorder() is not None


def _reset_after_fork() -> None:
    _State.recorder = None
    _State.decided = False
    _inflight.abandon_after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


def forget_in_flight() -> None:
    """Mark what has finished and let go of every work still held (see ``_inflight``); called
    when the default group ends and at exit."""
    _inflight.forget(_State.recorder)


def watch(ident: int, work: Any) -> None:
    """Mark ``ident`` started now, and completed (or failed) once ``work`` has finished."""
    rec = _State.recorder
    if rec is not None:
        _inflight.watch(rec, ident, work)


def sweep() -> None:
    """Mark every watched work that has finished."""
    rec = _State.recorder
    if rec is not None:
        _inflight.sweep(rec)


# --- recording ---------------------------------------------------------------------------------


def begin(
    op: str,
    group: str,
    tensors: Iterable[torch.Tensor],
    reduce_op: Any = None,
    with_shapes: bool = True,
    started: bool = False,
    caller: Optional[FrameType] = None,
    internal: bool = False,
) -> Optional[int]:
    """Record an issued operation (``started``: and already launched); its id, or None when
    recording is off. ``caller``: the frame that called the op, when the caller knows it (the
    call site's walk starts there instead of at this function's caller). ``internal``: an op
    of ferrodist's own that ``internal_call_site`` may place (see there)."""
    rec = _State.recorder if _State.decided else recorder()
    if rec is None:
        return None
    _inflight.sweep_before_record(rec)
    frame = caller or sys._getframe(1)
    site = internal_call_site(frame) if internal else call_site(frame)
    return rec.record_tensors(
        group, op, tensors, reduce_op_name(reduce_op), with_shapes, site, started
    )


def fail(ident: Optional[int], error: BaseException) -> None:
    """Mark ``ident`` failed and let the watchdog attach its diagnosis to ``error``."""
    # The watchdog diagnoses while the op still counts as pending (its report is about it).
    hook = _State.on_failure
    if hook is not None and not isinstance(error, (KeyboardInterrupt, SystemExit)):
        try:
            report = hook(error)
        except Exception:  # diagnosing must never hide the op's own error
            report = None
        if report:
            attach(error, report)
    rec = _State.recorder
    if rec is not None and ident is not None:
        rec.failed(ident, short(error))


def attach(error: BaseException, report: str) -> None:
    """Add ``report`` to ``error``: to its message where its type lets us, and as a note."""
    text = f"\n\nferrodist flight recorder:\n{report}"
    try:
        if error.args and isinstance(error.args[0], str) and text not in error.args[0]:
            error.args = (error.args[0] + text, *error.args[1:])
    except Exception:
        pass
    add_note = getattr(error, "add_note", None)
    if add_note is not None and text not in str(error):
        add_note(text.strip())


def run(
    op: str,
    group: Any,
    tensors: Iterable[torch.Tensor],
    reduce_op: Any,
    async_op: bool,
    fn: Callable[..., Any],
    /,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``fn(*args, **kwargs)``, recorded as ``op`` on ``group`` (positional-only parameters:
    ``fn``'s own keywords, ``group=`` and ``async_op=`` included, pass through)."""
    rec = _State.recorder if _State.decided else recorder()
    if rec is None:
        return fn(*args, **kwargs)
    ident = begin(op, describe_group(group), tensors, reduce_op)
    return finish_call(ident, async_op, fn, *args, **kwargs)


def finish_call(
    ident: Optional[int], async_op: bool, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> Any:
    """Call ``fn`` for the recorded ``ident`` and mark how it went."""
    rec = _State.recorder
    if rec is None or ident is None:
        return fn(*args, **kwargs)
    if not async_op:
        rec.started(ident)
    try:
        result = fn(*args, **kwargs)
    except BaseException as e:
        fail(ident, e)
        raise
    if async_op and not queued_only(result):
        watch(ident, result)
    else:
        _inflight.completed(rec, ident)
    return result


def waited(work: Any) -> None:
    """The issuer of an asynchronous op has waited for ``work``: its op completed (for works
    whose completion cannot be polled; see ``_inflight``)."""
    rec = _State.recorder
    if rec is not None:
        _inflight.waited(rec, work)


def started(ident: Optional[int]) -> None:
    """Mark ``ident`` started: its call is about to run, or has launched it."""
    rec = _State.recorder
    if rec is not None and ident is not None:
        rec.started(ident)


_PLACEHOLDER_WORK: Optional[type] = getattr(_c10d, "_IllegalWork", None)
"""What torch returns for an asynchronous call inside a coalescing block: the op is only queued
(the block's own work carries it), and every waiting method of this object raises."""


def queued_only(work: Any) -> bool:
    """Whether a launch returned no work of its own to wait for or poll: None (a rank outside
    the group, a synchronous call in a coalescing block) or torch's coalescing placeholder."""
    return work is None or (_PLACEHOLDER_WORK is not None and type(work) is _PLACEHOLDER_WORK)


def hold_until_finished(
    ident: Optional[int],
    work: Any,
    p2p: bool = False,
    on_finished: Optional[Callable[[Any], None]] = None,
    on_cpu: bool = False,
) -> None:
    """Mark the launched ``ident`` completed (or failed) once ``work`` has finished; at once
    when there is no work of its own (``queued_only``). ``p2p``: a point-to-point op, never
    counted completed because a later op completed (``_inflight.hold_p2p``), with
    ``on_finished(work)`` run before it is marked; ``on_cpu``: gloo's work, which has no future
    to ask for."""
    rec = _State.recorder
    if rec is None or ident is None:
        return
    if queued_only(work):
        _inflight.completed(rec, ident)
    elif p2p:
        _inflight.hold_p2p(ident, work, on_finished, asks_future=not on_cpu)
    else:
        _inflight.hold(ident, work)


def wait_launched(ident: Optional[int], work: Any, on_device: bool) -> None:
    """The synchronous call's end for the launched ``ident``: ``work.wait()``, then the op is
    completed. On a device (``on_device``) the wait only orders the current stream after the
    op, which NCCL has merely enqueued, so it is marked completed once the device has run it:
    an op stuck on the GPU stays pending to the watchdog and in dumps."""
    try:
        if not queued_only(work):
            work.wait()
    except BaseException as e:
        fail(ident, e)
        raise
    if on_device:
        hold_until_finished(ident, work)
        return
    rec = _State.recorder
    if rec is not None and ident is not None:
        _inflight.completed(rec, ident)


def received_from(ident: Optional[int], group: Any, source: int, objects: bool = False) -> None:
    """The receive from any source ``ident`` (recorded on ``any_source_channel(group)``) came
    from global rank ``source``: it moves to that pair's channel (``objects``: as an object
    transfer), taking its next number there as the sender's send did."""
    rec = _State.recorder
    if rec is None or ident is None or source < 0:
        return
    channel, op = p2p_channel(group, source, False)
    rec.moved(ident, channel, op.replace("p2p", "p2p_object", 1) if objects else op)


def run_p2p(
    tag: str,
    group: Any,
    peer: int,
    sending: bool,
    tensor: torch.Tensor,
    fn: Callable[..., Any],
    /,
    *args: Any,
) -> Any:
    """A blocking send or receive with global rank ``peer``, recorded as ``tag.p2p src->dst``."""
    rec = _State.recorder if _State.decided else recorder()
    if rec is None:
        return fn(*args)
    channel, op = p2p_channel(group, peer, sending)
    ident = begin(f"{tag}.{op}", channel, (tensor,))
    return finish_call(ident, False, fn, *args)
