"""The tensor collectives FSDP issues, under the installed torch's current names.

Why a module: torch 2.13 renamed ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` to
``all_gather_single`` and ``reduce_scatter_single`` and warns on every call of the old names (a
cost paid per unit per step); torch 2.4 has only the old names. The functions are torch's,
recorded in the flight recorder as FSDP's (``fsdp.all_gather``...; see ``ferrodist.debug``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist

from ferrodist._recorded_ops import collective

all_gather_flat: Callable[..., Any] = collective(
    "fsdp.all_gather",
    getattr(dist, "all_gather_single", dist.all_gather_into_tensor),
    "input_tensor",
)
"""``all_gather_flat(output, input, group=...)``: every rank's ``input`` concatenated."""

reduce_scatter_flat: Callable[..., Any] = collective(
    "fsdp.reduce_scatter",
    getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor),
    "input",
    "op",
)
"""``reduce_scatter_flat(output, input, group=...)``: this rank's chunk of the summed inputs."""

all_reduce: Callable[..., Any] = collective("fsdp.all_reduce", dist.all_reduce, "tensor", "op")
"""``all_reduce(tensor, group=...)``: a gradient's sum across a (replicate) group."""

reduce_scatter_by_all_to_all: Callable[..., Any] = collective(
    "fsdp.reduce_scatter", dist.all_to_all_single, "input"
)
"""``reduce_scatter_by_all_to_all(received, input, group=...)``: each rank's chunk of ``input``
sent to that rank, ``received`` holding every rank's chunk for this one (row = sender); the
sum is taken by the caller. What a reduce-scatter must move, (W-1)/W of the input per rank,
where gloo's own reduce-scatter moves twice that."""
