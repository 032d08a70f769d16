"""``ProcessGroupRoundRobin``: spread collectives over several process groups in turn.

torch once shipped this as a C++ class (gone in torch 2.13). Issuing consecutive collectives on
different underlying groups lets a backend with one queue per group (gloo runs each group's ops
on its own thread) overlap them. The class subclasses ``torch.distributed.ProcessGroup`` so it
goes wherever a group goes, and each method forwards, unchanged, to the next group in the cycle;
the returned ``Work`` is the underlying group's. Every rank must issue the same sequence of
collectives, as with any group, so every rank picks the same underlying group for each call.

Like torch's former class, it is not entered in torch's group registry: call its methods
(``rr.allreduce([t])``), or free functions that need no rank mapping (``dist.all_reduce(t,
group=rr)``); functions that translate ranks (``dist.broadcast(t, src, group=rr)``) raise torch's
"not initialized in the world group map" ``ValueError``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from ferrodist.c10d import ProcessGroup, Work

__all__ = ["ProcessGroupRoundRobin", "_round_robin_process_groups"]

_FORWARDED = (
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "reduce",
    "allgather",
    "_allgather_base",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "alltoall",
    "alltoall_base",
    "barrier",
    "send",
    "recv",
    "recv_anysource",
    "all_gather_single",
    "all_gather_single_coalesced",
    "all_to_all_single",
    "reduce_scatter_single",
    "reduce_scatter_single_coalesced",
    "monitored_barrier",
)


class ProcessGroupRoundRobin(ProcessGroup):
    """A process group that runs each collective on the next of ``process_groups`` in turn.

    Args:
        process_groups: two or more groups over the same ranks (same rank, same size).

    Example::

        >>> pgs = [dist.new_group(backend="gloo") for _ in range(2)]
        >>> rr = dist._round_robin_process_groups(pgs)
        >>> rr.allreduce([t]).wait()   # on pgs[0]; the next call goes to pgs[1]
    """

    def __init__(self, process_groups: Sequence[ProcessGroup]) -> None:
        groups = list(process_groups)
        if not groups:
            raise ValueError("process_groups must name at least one process group")
        for pg in groups:
            if not isinstance(pg, ProcessGroup):
                raise TypeError(
                    f"process_groups must hold ProcessGroup objects, got {type(pg).__name__}"
                )
            if pg.rank() != groups[0].rank() or pg.size() != groups[0].size():
                raise ValueError("process_groups must all have the same rank and size")
        super().__init__(groups[0].rank(), groups[0].size())  # type: ignore[call-arg]
        self._groups = groups
        self._cycle = itertools.cycle(groups)

    @property
    def process_groups(self) -> list[ProcessGroup]:
        """The underlying groups, in the order they take turns."""
        return list(self._groups)

    def _next(self) -> ProcessGroup:
        return next(self._cycle)

    def getBackendName(self) -> str:
        """The backend name torch's ``ProcessGroupRoundRobin`` reported."""
        return "round_robin"

    def name(self) -> str:
        """Same as ``getBackendName``."""
        return "round_robin"


def _forward(method: str) -> Any:
    def call(self: ProcessGroupRoundRobin, *args: Any, **kwargs: Any) -> Work:
        return getattr(self._next(), method)(*args, **kwargs)

    call.__name__ = method
    call.__doc__ = f"``ProcessGroup.{method}`` on the next underlying group."
    return call


for _method in _FORWARDED:
    if hasattr(ProcessGroup, _method):  # the set of methods varies between torch versions
        setattr(ProcessGroupRoundRobin, _method, _forward(_method))


def _round_robin_process_groups(process_groups: Sequence[ProcessGroup]) -> ProcessGroupRoundRobin:
    """Build a ``ProcessGroupRoundRobin`` over ``process_groups`` (at least one)."""
    if len(process_groups) == 0:
        raise ValueError("Round Robin requires at least one process group")
    return ProcessGroupRoundRobin(process_groups)
