"""FullyShardedDataParallel (placeholder: the runtime's ``__init__`` replaces this file)."""

from ._layout import FlatParamLayout, ShardParamInfo, plan_flat_param

__all__ = ["FlatParamLayout", "ShardParamInfo", "plan_flat_param"]
