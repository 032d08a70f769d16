"""FullyShardedDataParallel (placeholder: the runtime's ``__init__`` replaces this file)."""

from ._layout import FlatParamLayout, ShardParamInfo, plan_flat_param
from ._memory import FlatParamMemory, MemoryEstimate, estimate_memory

__all__ = [
    "FlatParamLayout",
    "FlatParamMemory",
    "MemoryEstimate",
    "ShardParamInfo",
    "estimate_memory",
    "plan_flat_param",
]
