"""``ferrodist.fsdp``: torch's ``torch.distributed.fsdp`` surface with ferrodist's FSDP runtime.

Every configuration type and every FSDP2 name (``fully_shard``, ``FSDPModule``,
``MixedPrecisionPolicy``...) is torch's own object, so a ``ShardingStrategy`` or
``MixedPrecision`` built from either module is accepted by both, and ``__all__`` is torch's.
``FullyShardedDataParallel`` is ferrodist's: the flat-parameter layout is planned in Rust and the
training step runs on torch's collectives over ferrodist's process groups, bit-identical to
torch's FSDP.

ferrodist's own additions (the flat-parameter layout planner and ``estimate_memory``) are
importable from here too, but stay out of ``__all__``, which is exactly torch's.
"""

from torch.distributed.fsdp import BackwardPrefetch as BackwardPrefetch
from torch.distributed.fsdp import CPUOffload as CPUOffload
from torch.distributed.fsdp import FullOptimStateDictConfig as FullOptimStateDictConfig
from torch.distributed.fsdp import FullStateDictConfig as FullStateDictConfig
from torch.distributed.fsdp import LocalOptimStateDictConfig as LocalOptimStateDictConfig
from torch.distributed.fsdp import LocalStateDictConfig as LocalStateDictConfig
from torch.distributed.fsdp import MixedPrecision as MixedPrecision
from torch.distributed.fsdp import OptimStateDictConfig as OptimStateDictConfig
from torch.distributed.fsdp import OptimStateKeyType as OptimStateKeyType
from torch.distributed.fsdp import ShardedOptimStateDictConfig as ShardedOptimStateDictConfig
from torch.distributed.fsdp import ShardedStateDictConfig as ShardedStateDictConfig
from torch.distributed.fsdp import ShardingStrategy as ShardingStrategy
from torch.distributed.fsdp import StateDictConfig as StateDictConfig
from torch.distributed.fsdp import StateDictSettings as StateDictSettings
from torch.distributed.fsdp import StateDictType as StateDictType

from ._api import torch_all, torch_objects
from ._layout import FlatParamLayout as FlatParamLayout
from ._layout import ShardParamInfo as ShardParamInfo
from ._layout import plan_flat_param as plan_flat_param
from ._memory import FlatParamMemory as FlatParamMemory
from ._memory import MemoryEstimate as MemoryEstimate
from ._memory import estimate_memory as estimate_memory
from ._wrapper import FullyShardedDataParallel as FullyShardedDataParallel

# The FSDP2 names, and whatever else the installed torch exports, as torch's own objects.
globals().update(torch_objects)

__all__ = list(torch_all)
