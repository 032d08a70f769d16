"""Prefetching: issue a unit's all-gather before the unit needs it, so communication runs under
the compute of the unit before it.

Why an order learned from the forward: the unit that needs its parameters next is, in the
forward, the one whose forward began after this one's, and in the backward the one whose forward
ended before this one's (autograd runs the units in reverse). The root records both orders every
step and prefetches by the previous step's; a step that runs its units in another order only
prefetches a unit that is not needed next, which costs memory for a while, never a wrong number:
a prefetched gather fills the same buffer the synchronous one would, and nothing reads it before
``unshard`` has waited for it.

The settings are torch's: ``backward_prefetch=BACKWARD_PRE`` issues the next unit's gather in a
unit's pre-backward (after its own), ``BACKWARD_POST`` in its post-backward (before its
reduce-scatter), ``None`` never; ``forward_prefetch=True`` issues the next unit's gather in a
unit's pre-forward. At most one gather runs ahead of the one being waited for, which is the
bound ``limit_all_gathers`` asks for (torch's rate limiter allows two in flight).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from torch.distributed.fsdp import BackwardPrefetch

if TYPE_CHECKING:
    from ._wrapper import FullyShardedDataParallel

__all__ = ["Order", "after_backward", "after_forward", "backward", "forward", "record"]


class _Sequence:
    """One order of the units: this step's, being recorded, and the last complete one."""

    __slots__ = ("last", "position", "this_step")

    def __init__(self) -> None:
        self.this_step: list[FullyShardedDataParallel] = []
        self.last: list[FullyShardedDataParallel] = []
        self.position: dict[int, int] = {}

    def close_step(self) -> None:
        if self.this_step:
            self.last = self.this_step
            self.position = {id(u): i for i, u in enumerate(self.last)}
            self.this_step = []

    def neighbour(
        self, unit: FullyShardedDataParallel, step: int
    ) -> Optional[FullyShardedDataParallel]:
        """The unit ``step`` places from ``unit`` in the last complete order."""
        at = self.position.get(id(unit))
        if at is None:
            return None
        index = at + step
        return self.last[index] if 0 <= index < len(self.last) else None


class Order:
    """The root's record of its units' forward: the order of their pre-forwards (the order the
    next forward needs them in) and of their post-forwards (reversed, the order the backward
    needs them in: a unit's backward begins before those of the units nested in it)."""

    __slots__ = ("post", "pre")

    def __init__(self) -> None:
        self.pre = _Sequence()
        self.post = _Sequence()


def _root_order(unit: FullyShardedDataParallel) -> Optional[Order]:
    root = unit._root
    return None if root is None else root._prefetch_order


def record(unit: FullyShardedDataParallel) -> None:
    """A unit's pre-forward: note its place in this step's order."""
    order = _root_order(unit)
    if order is not None and unit._handle is not None:
        order.pre.this_step.append(unit)


def after_forward(unit: FullyShardedDataParallel) -> None:
    """A unit's post-forward: note its place; at the root's, this step's orders become the ones
    to prefetch by, and a forward prefetch that no unit used is let go of."""
    order = _root_order(unit)
    if order is None:
        return
    if unit._handle is not None:
        order.post.this_step.append(unit)
    if unit._is_root:
        order.pre.close_step()
        order.post.close_step()
        drop_unused(unit)


def drop_unused(root: FullyShardedDataParallel) -> None:
    """Wait for and free every gather issued ahead that no unit took."""
    for unit in root._all_units:
        if unit._handle is not None:
            unit._handle.drop_prefetch()


def _issue(target: Optional[FullyShardedDataParallel]) -> None:
    if target is not None and target._handle is not None:
        target._handle.prefetch()


def forward(unit: FullyShardedDataParallel) -> None:
    """A unit's pre-forward, after its own unshard: with ``forward_prefetch``, the next unit's."""
    order = _root_order(unit)
    if order is not None and unit.forward_prefetch:
        _issue(order.pre.neighbour(unit, +1))


def backward(unit: FullyShardedDataParallel) -> None:
    """A unit's pre-backward, after its own unshard: with ``BACKWARD_PRE``, the next unit's."""
    order = _root_order(unit)
    if order is not None and unit.backward_prefetch == BackwardPrefetch.BACKWARD_PRE:
        _issue(order.post.neighbour(unit, -1))


def after_backward(unit: FullyShardedDataParallel) -> None:
    """A unit's post-backward, before its reduction: with ``BACKWARD_POST``, the next unit's."""
    order = _root_order(unit)
    if order is not None and unit.backward_prefetch == BackwardPrefetch.BACKWARD_POST:
        _issue(order.post.neighbour(unit, -1))
