"""FSDP's all-gather and reduce-scatter on gloo, composed of sends and receives posted first.

Why: between two hosts, gloo's own collectives move the right bytes at half the link's rate. A
transfer that both ranks of a pair make at once over their one connection, each sending before
it has posted its receive, runs at about half speed (67 MB each way over a 1 Gbit/s lab link:
2.05x the link time), and that is what gloo's all-gather (1.84x) and all-to-all (2.35x) do at two
ranks. Posting every receive before any send runs both directions at the link's rate (1.04x;
``benches/bench_comm_bound.py`` and ``benches/README.md`` have the figures). The bytes are the
minimum, (W-1)/W of the gathered or reduced tensor per rank, and nothing is computed on the way:
an all-gather is the same bits however it is moved, and a reduce-scatter's sum is taken by the
caller in rank order, as it was over the all-to-all.

The transfers are torch's own ``irecv`` and ``isend`` (never a transport of our own), each
operation on a tag of its own so that two in flight on a group (a prefetched all-gather beside a
reduce-scatter) cannot take each other's messages; every rank issues a group's operations in
the same order, so the tags agree.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as _c10d

__all__ = ["ExchangeWork", "all_gather", "chosen_for", "reduce_scatter_rows"]

_TAG_BASE = 0x4000_0000
"""Tags far above what user code passes to ``send`` / ``recv`` (0 by default), so a user's
point-to-point traffic on the same group is never matched with FSDP's."""
_TAG_SPAN = 0x3FFF_FFFF

_next_tag: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""Per group: how many exchanges it has carried (the next one's tag). Weak, so that a
destroyed group's backend is not kept alive here."""


def chosen_for(group: Any, tensor: torch.Tensor) -> bool:
    """Whether FSDP moves ``tensor``'s collectives on ``group`` by exchange: CPU tensors on a
    gloo group of two ranks, where the result is gloo's bit for bit (a reduce-scatter's sum of
    two is the same either way round). ``FERRODIST_FSDP_EXCHANGE=0`` keeps gloo's collectives;
    ``=1`` asks for the exchange at any size (a reduce-scatter then sums in rank order, not in
    gloo's ring order: see the README)."""
    if not tensor.is_cpu:
        return False
    group = group if group is not None else _c10d._get_default_group()
    size = _gloo_size.get(group)
    if size is None:
        size = dist.get_world_size(group) if "gloo" in str(dist.get_backend(group)) else 0
        _gloo_size[group] = size
    if not size:
        return False
    chosen = os.environ.get("FERRODIST_FSDP_EXCHANGE", "").strip()
    if chosen in ("0", "1"):
        return chosen == "1"
    return size == 2


_gloo_size: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""Per group: its size where gloo carries its CPU tensors, else 0 (asked once per group)."""


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
        return all(work.is_completed() for work in self._works)

    def get_future(self) -> Any:
        raise RuntimeError("ExchangeWork::getFuture not implemented (poll is_completed)")


def _exchange(group: Any, sends: list[torch.Tensor], receives: list[torch.Tensor]) -> ExchangeWork:
    """Send ``sends[r]`` to and receive ``receives[r]`` from every other rank ``r`` of
    ``group`` (group ranks; this rank's own entries are skipped): every receive first."""
    group = group if group is not None else _c10d._get_default_group()
    me = dist.get_rank(group)
    tag = _TAG_BASE + _next_tag.get(group, 0) % _TAG_SPAN
    _next_tag[group] = _next_tag.get(group, 0) + 1
    peers = [
        (r, dist.get_global_rank(group, r)) for r in range(dist.get_world_size(group)) if r != me
    ]
    works = [dist.irecv(receives[r], peer, group=group, tag=tag) for r, peer in peers]
    works += [dist.isend(sends[r], peer, group=group, tag=tag) for r, peer in peers]
    return ExchangeWork(works)


def all_gather(
    output_tensor: torch.Tensor,
    input_tensor: torch.Tensor,
    group: Any = None,
    async_op: bool = False,
) -> Optional[ExchangeWork]:
    """``all_gather_into_tensor``'s contract: every rank's ``input_tensor`` concatenated into
    ``output_tensor`` in rank order."""
    slots = list(output_tensor.view(-1, input_tensor.numel()))
    slots[dist.get_rank(group)].copy_(input_tensor.view(-1))
    flat = input_tensor.view(-1)
    work = _exchange(group, [flat] * len(slots), slots)
    if async_op:
        return work
    work.wait()
    return None


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
    chunks = list(input.view(world, -1))
    rows = list(received.view(world, -1))
    me = dist.get_rank(group)
    rows[me].copy_(chunks[me])
    work = _exchange(group, chunks, rows)
    if async_op:
        return work
    work.wait()
    return None
