"""Collectives on gloo composed of torch's sends and receives, every receive posted first.

Why: between two hosts, gloo's own collectives move the right bytes at up to half the link's
rate. A transfer that both ranks of a pair make at once over their one connection, each sending
before it has posted its receive, runs at about half speed (67 MB each way over a 1 Gbit/s lab
link: 2.05x the link time), and gloo's all-gather (1.74x) and all-to-all (2.36x) are that slow
at two ranks; posting every receive before any send runs both directions at the link's rate
(1.04x; ``benches/bench_gloo_pair.py``). Used for FSDP's all-gather and reduce-scatter and for
ZeRO's parameter broadcasts (one per parameter, issued owner by owner: one exchange took ZeRO's
lab step from torch's time to 0.76x-0.82x of it). The bytes are the minimum, (W-1)/W of the
gathered, reduced or broadcast tensors per rank, and nothing is computed on the way (a
reduce-scatter's sum is the caller's, in rank order), so the bits are gloo's wherever the sum
of two is (at two ranks, the default; ``chosen_for``).

The transfers are torch's own ``irecv`` and ``isend`` (never a transport of our own), each
operation on a tag of its own so that two in flight on a group (a prefetched all-gather beside a
reduce-scatter) cannot take each other's messages; every rank issues a group's operations in
the same order, so the tags agree, and within one operation the messages of one direction are
matched in the order both ends issue them.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as _c10d

from ferrodist.debug._inflight import futureless

__all__ = ["ExchangeWork", "all_gather", "broadcast_each", "chosen_for", "reduce_scatter_rows"]

_TAG_BASE = 0x4000_0000
"""Tags far above what user code passes to ``send`` / ``recv`` (0 by default), so a user's
point-to-point traffic on the same group is never matched with FSDP's."""
_TAG_SPAN = 0x3FFF_FFFF

_next_tag: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""Per group: how many exchanges it has carried (the next one's tag). Weak, so that a
destroyed group's backend is not kept alive here."""


_gloo_size: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""Per group: its size where gloo carries its CPU tensors, else 0 (asked once per group)."""


def chosen_for(group: Any, tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s collectives on ``group`` go by exchange: CPU tensors on a gloo group
    of two ranks, where the result is gloo's bit for bit (a reduce-scatter's sum of two is the
    same either way round). ``FERRODIST_EXCHANGE=0`` keeps gloo's collectives; ``=1`` asks for
    the exchange at any size (an FSDP reduce-scatter then sums in rank order, not in gloo's
    ring order: see the README)."""
    if not tensor.is_cpu:
        return False
    group = group if group is not None else _c10d._get_default_group()
    size = _gloo_size.get(group)
    if size is None:
        size = dist.get_world_size(group) if "gloo" in str(dist.get_backend(group)) else 0
        _gloo_size[group] = size
    if not size:
        return False
    chosen = os.environ.get("FERRODIST_EXCHANGE", "").strip()
    if chosen in ("0", "1"):
        return chosen == "1"
    return size == 2


@futureless
class ExchangeWork:
    """The receives and sends of one exchange, as one work: ``wait`` waits for all of them."""

    def __init__(self, works: list[Any]) -> None:
        self._works = works

    def wait(self, timeout: Optional[Any] = None) -> bool:
        for work in self._works:
            if timeout is None:
                work.wait()
            else:
                work.wait(timeout)
        return True

    def is_completed(self) -> bool:
        for work in self._works:
            if not work.is_completed():
                return False
        return True

    def get_future(self) -> Any:
        raise RuntimeError("ExchangeWork::getFuture not implemented (poll is_completed)")


def _exchange(
    group: Any, receives: list[tuple[torch.Tensor, int]], sends: list[tuple[torch.Tensor, int]]
) -> ExchangeWork:
    """Post every ``(tensor, group rank)`` receive, then every send, on one new tag."""
    group = group if group is not None else _c10d._get_default_group()
    count = _next_tag.get(group, 0)
    _next_tag[group] = count + 1
    tag = _TAG_BASE + count % _TAG_SPAN
    works = [
        dist.irecv(t, dist.get_global_rank(group, r), group=group, tag=tag) for t, r in receives
    ]
    works += [dist.isend(t, dist.get_global_rank(group, r), group=group, tag=tag) for t, r in sends]
    return ExchangeWork(works)


def _finish(work: ExchangeWork, async_op: bool) -> Optional[ExchangeWork]:
    if async_op:
        return work
    work.wait()
    return None


def _swap_rows(
    group: Any, rows: list[torch.Tensor], outgoing: list[torch.Tensor], async_op: bool
) -> Optional[ExchangeWork]:
    """``rows[r]`` receives rank ``r``'s ``outgoing[me]`` while ``outgoing[r]`` goes to rank
    ``r``; this rank's own row is copied in."""
    me = dist.get_rank(group)
    rows[me].copy_(outgoing[me])
    peers = [r for r in range(len(rows)) if r != me]
    work = _exchange(group, [(rows[r], r) for r in peers], [(outgoing[r], r) for r in peers])
    return _finish(work, async_op)


def all_gather(
    output_tensor: torch.Tensor,
    input_tensor: torch.Tensor,
    group: Any = None,
    async_op: bool = False,
) -> Optional[ExchangeWork]:
    """``all_gather_into_tensor``'s contract: every rank's ``input_tensor`` concatenated into
    ``output_tensor`` in rank order."""
    slots = list(output_tensor.view(-1, input_tensor.numel()))
    return _swap_rows(group, slots, [input_tensor.view(-1)] * len(slots), async_op)


def reduce_scatter_rows(
    received: torch.Tensor,
    input: torch.Tensor,
    group: Any = None,
    async_op: bool = False,
) -> Optional[ExchangeWork]:
    """Rank ``r``'s chunk of ``input`` sent to rank ``r``; ``received`` (shaped like
    ``input``) holds every rank's chunk for this one, row = sender, this rank's own copied in.
    The sum of the rows is the caller's to take."""
    world = dist.get_world_size(group)
    return _swap_rows(group, list(received.view(world, -1)), list(input.view(world, -1)), async_op)


def broadcast_each(
    tensors: list[torch.Tensor],
    owners: list[int],
    group: Any = None,
    async_op: bool = False,
) -> Optional[ExchangeWork]:
    """``broadcast(tensors[i], src=owners[i])`` for every ``i`` (owners are group ranks): the
    owner's tensor lands in every other rank's, bit for bit."""
    me = dist.get_rank(group)
    peers = [r for r in range(dist.get_world_size(group)) if r != me]
    receives = [(t, owner) for t, owner in zip(tensors, owners) if owner != me]
    sends = [(t, r) for t, owner in zip(tensors, owners) if owner == me for r in peers]
    return _finish(_exchange(group, receives, sends), async_op)
