"""``ferrodist.optim``: a drop-in for ``torch.distributed.optim``.

ferrodist's own: :class:`ZeroRedundancyOptimizer` (ZeRO stage 1, reshardable checkpoints),
:class:`ShardedOptimizer` (with working state dicts) and the optimizer-overlap API
(:func:`register_overlapped`, :class:`OverlappedOptimizer`). The rest of
``torch.distributed.optim.__all__`` is re-exported from torch so ``ferrodist.optim`` can replace
it in an import.
"""

from __future__ import annotations

import torch
from torch.distributed.optim import PostLocalSGDOptimizer, as_functional_optim

from ferrodist.algorithms._optimizer_overlap.optimizer_overlap import (
    OverlappedOptimizer,
    register_overlapped,
)
from ferrodist.algorithms._optimizer_overlap.optimizer_overlap import (
    _as_overlapped_optim as _as_overlapped_optim,  # private, as in torch: kept out of __all__
)
from ferrodist.optim.sharded_optimizer import ShardedOptimizer
from ferrodist.optim.zero_redundancy_optimizer import ZeroRedundancyOptimizer

__all__ = [
    "OverlappedOptimizer",
    "PostLocalSGDOptimizer",
    "ShardedOptimizer",
    "ZeroRedundancyOptimizer",
    "as_functional_optim",
    "register_overlapped",
]

# torch exports DistributedOptimizer only where RPC is built in; so does ferrodist.
if hasattr(torch._C, "_rpc_init"):
    from torch.distributed.optim import DistributedOptimizer

    __all__ += ["DistributedOptimizer"]
