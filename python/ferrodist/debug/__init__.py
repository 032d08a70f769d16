"""``ferrodist.debug``: the flight recorder, for finding out why a job hangs.

Every collective and point-to-point op through ``ferrodist`` (and the traffic of ferrodist's DDP,
FSDP and ZeRO, tagged ``ddp.``, ``fsdp.``, ``zero.``) is recorded in a fixed-size ring per process:
group, per-group sequence number, op, shapes, dtypes, reduce op, state, timestamps and the call
site. While a process group lives, a watchdog thread publishes a summary of the ring to the job's
store and, when an op has been pending longer than a threshold, reads the other ranks' summaries
and names who is behind, who diverged and who is gone (``ferrodist.debug._watchdog``).

Environment:
    ``FERRODIST_FLIGHT_RECORDER=0``: record nothing (no watchdog either).
    ``FERRODIST_FLIGHT_RECORDER_SIZE``: ring capacity (default 2048 ops).
    ``FERRODIST_HANG_THRESHOLD_S``: how long an op may be pending before the watchdog diagnoses
    (default a quarter of the default group's timeout).
    ``FERRODIST_FLIGHT_DUMP_DIR``: where dumps go (default ``<tmp>/ferrodist-flight-<uid>``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, Optional

import torch

from ferrodist.debug import _recorder, _watchdog
from ferrodist.debug._dump import dump
from ferrodist.debug._recorder import recorder

__all__ = ["RecordedOp", "dump", "last_report", "record_op", "recorder"]


class RecordedOp:
    """What :func:`record_op` yields: set ``work`` to the op's ``Work`` when it is asynchronous,
    so that completion is marked when the work finishes rather than when the block ends."""

    __slots__ = ("ident", "work")

    def __init__(self, ident: Optional[int]) -> None:
        self.ident = ident
        self.work: Any = None


@contextlib.contextmanager
def record_op(
    op: str,
    group: Any = None,
    tensors: Iterable[torch.Tensor] = (),
    reduce_op: Any = None,
) -> Iterator[RecordedOp]:
    """Record the collective issued inside the block as ``op`` on ``group`` (a process group,
    None for the default one, or a group name).

    Example::

        with ferrodist.debug.record_op("my.all_reduce", group, [t], "SUM") as rec:
            rec.work = group.allreduce([t])
    """
    name = group if isinstance(group, str) else _recorder.describe_group(group)
    handle = RecordedOp(_recorder.begin(op, name, tensors, reduce_op))
    rec = _recorder.recorder()
    if rec is not None and handle.ident is not None:
        rec.started(handle.ident)
    try:
        yield handle
    except BaseException as e:
        _recorder.fail(handle.ident, e)
        raise
    if rec is None or handle.ident is None:
        return
    if handle.work is not None:
        _recorder.watch(handle.ident, handle.work)
    else:
        rec.completed(handle.ident)


def last_report() -> Optional[str]:
    """The watchdog's latest diagnosis of a hang in this process, or None."""
    return _watchdog.last_report()
