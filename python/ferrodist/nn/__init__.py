"""``ferrodist.nn``: ``from ferrodist.nn import DistributedDataParallel`` as from torch."""

from __future__ import annotations

from ferrodist.ddp.data_parallel import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
