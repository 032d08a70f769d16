"""The tensor collectives FSDP issues, under the installed torch's current names.

Why a module: torch 2.13 renamed ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` to
``all_gather_single`` and ``reduce_scatter_single`` and warns on every call of the old names (a
cost paid per unit per step); torch 2.4 has only the old names. The functions are torch's,
recorded in the flight recorder as FSDP's (``fsdp.all_gather``...; see ``ferrodist.debug``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ferrodist._exchange import all_gather as exchange_all_gather
from ferrodist._exchange import chosen_for, reduce_scatter_rows
from ferrodist._recorded_ops import collective

_torch_all_gather: Callable[..., Any] = getattr(
    dist, "all_gather_single", dist.all_gather_into_tensor
)


def _all_gather(
    output_tensor: torch.Tensor,
    input_tensor: torch.Tensor,
    group: Any = None,
    async_op: bool = False,
) -> Optional[Any]:
    if chosen_for(group, input_tensor):
        return exchange_all_gather(output_tensor, input_tensor, group, async_op)
    return _torch_all_gather(output_tensor, input_tensor, group=group, async_op=async_op)


all_gather_flat: Callable[..., Any] = collective("fsdp.all_gather", _all_gather, "input_tensor")
"""``all_gather_flat(output, input, group=...)``: every rank's ``input`` concatenated (on gloo
at two ranks by exchange: ``ferrodist._exchange``)."""

runtime_all_gather_flat: Callable[..., Any] = collective(
    "fsdp.all_gather", _all_gather, "input_tensor", internal=True
)
"""``all_gather_flat`` as the runtime issues it, from a unit's forward or its backward hooks
only: placed at the user's line without walking the stack (``internal_call_site``). The other
ops here are issued only by the runtime's backward hooks."""

reduce_scatter_flat: Callable[..., Any] = collective(
    "fsdp.reduce_scatter",
    getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor),
    "input",
    "op",
    internal=True,
)
"""``reduce_scatter_flat(output, input, group=...)``: this rank's chunk of the summed inputs."""

all_reduce: Callable[..., Any] = collective(
    "fsdp.all_reduce", dist.all_reduce, "tensor", "op", internal=True
)
"""``all_reduce(tensor, group=...)``: a gradient's sum across a (replicate) group."""

reduce_scatter_by_exchange: Callable[..., Any] = collective(
    "fsdp.reduce_scatter", reduce_scatter_rows, "input", internal=True
)
"""``reduce_scatter_by_exchange(received, input, group=...)``: each rank's chunk of ``input``
sent to that rank, ``received`` holding every rank's chunk for this one (row = sender); the
sum is taken by the caller. What a reduce-scatter must move, (W-1)/W of the input per rank,
where gloo's own reduce-scatter moves twice that (see ``ferrodist._exchange``)."""
