"""torch's ``torch.distributed.fsdp.wrap`` policies, as torch's own objects.

Why re-export: the auto-wrap policies and ``enable_wrap``/``wrap`` are torch's; they take the
wrapper class as an argument, so ``wrapper_cls=ferrodist.fsdp.FullyShardedDataParallel`` and
``auto_wrap_policy=ModuleWrapPolicy(...)`` work with ferrodist's FSDP unchanged.
"""

from torch.distributed.fsdp.wrap import (
    CustomPolicy,
    ModuleWrapPolicy,
    always_wrap_policy,
    enable_wrap,
    lambda_auto_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
    wrap,
)

__all__ = [
    "CustomPolicy",
    "ModuleWrapPolicy",
    "always_wrap_policy",
    "enable_wrap",
    "lambda_auto_wrap_policy",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
    "wrap",
]
