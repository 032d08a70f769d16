"""How an operation is described in the ring: its group, dtypes, reduce op (its call site:
``_call_site``).

Everything here runs on every recorded op, so each piece is cached where it can be: reduce op
names (dtypes are named by the ring's ``FlightRecorder.record_tensors``). Group names are what
every member of a group calls it, so that the diagnosis can line the ranks' rings up: ``WORLD``
for the default group, torch's registered name otherwise.

Point-to-point traffic goes on a channel per direction between two ranks (``WORLD:p2p:0->1``),
named for it on both ends (``p2p 0->1``): a send and its receive then share a sequence number and
a signature, only the two ranks are members of the channel, and the group's collective sequence
has no gap on the ranks outside the pair (which would read as a rank falling behind). One channel
per direction, not per pair, because transfers in opposite directions need not be issued in the
same order on both ends (two ranks that each send, then receive, in one batch): only transfers
in one direction are matched in order by every backend. A receive from any source waits on a
channel of its own rank until it knows its sender (``any_source_channel``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch.distributed as _tdist
import torch.distributed.distributed_c10d as _c10d

__all__ = ["any_source_channel", "describe_group", "p2p_channel", "reduce_op_name"]


def describe_group(group: Any) -> str:
    """A group's name as every member spells it: ``WORLD`` for the default group, else torch's
    registered name (assigned in creation order, so the same on every rank)."""
    if group is None:
        return "WORLD"
    world = _c10d._world
    if group is world._default_pg:
        return "WORLD"
    name = world.pg_names.get(group)
    return "?" if name is None else str(name)


_reduce_op_names: dict[int, tuple[Any, str]] = {}
"""Per reduce op kind (``ReduceOp.SUM`` and the like, one object each), by ``id`` with the object
itself: its name. Reading it through pybind's enum costs microseconds, and so does hashing one
(a tenth of a microsecond on every op), which a lookup by ``id`` avoids."""


def reduce_op_name(op: Any) -> Optional[str]:
    if op is None or type(op) is str:  # already a name (DDP's buckets pass "SUM")
        return op
    known = _reduce_op_names.get(id(op))
    if known is not None and known[0] is op:
        return known[1]
    name = _reduce_op_name(op)
    if isinstance(op, _tdist.ReduceOp.RedOpType) and len(_reduce_op_names) < 64:
        _reduce_op_names[id(op)] = (op, name)
    return name


def _reduce_op_name(op: Any) -> str:
    name = getattr(op, "name", None)
    if name is None:  # a ReduceOp instance (PREMUL_SUM): its kind is .op
        inner = getattr(op, "op", None)
        name = getattr(inner, "name", None)
    return str(name) if name is not None else str(op)


def p2p_channel(group: Any, peer: int, sending: bool) -> tuple[str, str]:
    """(group key, op name) of a point-to-point transfer with global rank ``peer``."""
    me = _tdist.get_rank()
    src, dst = (me, peer) if sending else (peer, me)
    return f"{describe_group(group)}:p2p:{src}->{dst}", f"p2p {src}->{dst}"


def any_source_channel(group: Any) -> tuple[str, str]:
    """(group key, op name) of a receive from any source until its sender is known: a channel
    of this rank's alone (``WORLD:p2p:any->1``). Once it completes it moves to its sender's
    channel (``FlightRecorder.moved``), whose numbering the sender keeps. It takes the number
    the channel is at when it is seen finished: exact for a synchronous receive, and for an
    ``irecv`` unless a receive naming the same sender is outstanding beside it: the two may then
    be numbered in the opposite order to the one the backend matched them in (and the diagnosis
    compare the wrong pair of shapes)."""
    me = _tdist.get_rank()
    return f"{describe_group(group)}:p2p:any->{me}", f"p2p any->{me}"
