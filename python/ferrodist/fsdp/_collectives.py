"""The two tensor collectives FSDP needs, under the installed torch's current names.

Why a module: torch 2.13 renamed ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` to
``all_gather_single`` and ``reduce_scatter_single`` and warns on every call of the old names (a
cost paid per unit per step); torch 2.4 has only the old names. The functions are torch's.
"""

from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist

all_gather_flat: Callable[..., Any] = getattr(
    dist, "all_gather_single", dist.all_gather_into_tensor
)
"""``all_gather_flat(output, input, group=...)``: every rank's ``input`` concatenated."""

reduce_scatter_flat: Callable[..., Any] = getattr(
    dist, "reduce_scatter_single", dist.reduce_scatter_tensor
)
"""``reduce_scatter_flat(output, input, group=...)``: this rank's chunk of the summed inputs."""
