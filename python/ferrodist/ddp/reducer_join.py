"""The Reducer's side of Join (uneven inputs): what a joined rank's hook asks of it.

A rank that ran out of data still takes part in every collective of an iteration: it reduces
zero-filled copies of the buckets, sums its (empty) used-parameter map, and lets the training
ranks' forward all-reduce tell the Reducer how many ranks still contribute gradients.
"""

from __future__ import annotations

from typing import Any

import torch

from ferrodist.ddp.bucket import Bucket
from ferrodist.ddp.grad_bucket import GradBucket


class ReducerJoinSupport:
    """Join entry points of torch's Reducer; mixed into :class:`ferrodist.Reducer`."""

    _buckets: list[Bucket]
    _params: list[torch.Tensor]
    _plan: Any
    _forward_work: Any
    _static_world_size: bool

    def _set_forward_pass_work_handle(self, work: Any, use_static_world_size: bool) -> None:
        self._forward_work = work
        self._static_world_size = bool(use_static_world_size)

    def _get_zeros_like_grad_buckets(self) -> list[GradBucket]:
        count = len(self._buckets)
        return [
            b.grad_bucket(i, count, torch.zeros_like(b.buffer)) for i, b in enumerate(self._buckets)
        ]

    def _get_local_used_map(self) -> torch.Tensor:
        return torch.frombuffer(bytearray(self._plan.used_bytes()), dtype=torch.int32)

    def _push_all_rebuilt_params(self) -> None:
        self._plan.set_rebuild_order(list(range(len(self._params))))
