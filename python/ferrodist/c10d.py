"""The ``torch.distributed`` / ``_distributed_c10d`` types a training script touches.

ferrodist never re-implements a tensor collective, so the process-group machinery (groups,
``Work`` handles, reduce ops, option structs, the group registry, debug levels) *is* torch's: the
names below are torch's own objects, re-exported. That is what makes ``import ferrodist as dist``
a drop-in: ``isinstance(pg, dist.ProcessGroup)`` holds for groups torch made, a ``dist.Work`` is
what torch's DDP waits on, and a ``dist.ReduceOp`` is accepted by torch's backends unchanged.

What torch 2.13 lacks gets a ferrodist stand-in: ``ProcessGroupUCC`` and ``ProcessGroupMPI`` exist
only in torch builds compiled with them; here they are classes that raise a clear error when used,
so ``isinstance`` checks against them work (and are false) and construction explains itself.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch
import torch.distributed as _tdist
from torch._C._distributed_c10d import (
    _DistributedBackendOptions,
    _hash_tensors,
    _ProcessGroupWrapper,
    _register_process_group,
    _resolve_process_group,
    _set_global_rank,
    _unregister_all_process_groups,
    _unregister_process_group,
    set_debug_level,
    set_debug_level_from_env,
)
from torch.distributed import (
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    Backend,
    BackendConfig,
    BarrierOptions,
    BroadcastOptions,
    DebugLevel,
    GatherOptions,
    GroupMember,
    ProcessGroup,
    ProcessGroupGloo,
    ProcessGroupNCCL,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    Work,
    _broadcast_coalesced,
    _make_nccl_premul_sum,
    _test_python_store,
    _verify_params_across_processes,
    get_debug_level,
    group,
)
from torch.distributed.distributed_c10d import AllgatherOptions

__all__ = [
    "AllToAllOptions",
    "AllgatherOptions",
    "AllreduceCoalescedOptions",
    "AllreduceOptions",
    "Backend",
    "BackendConfig",
    "BarrierOptions",
    "BroadcastOptions",
    "DebugLevel",
    "GatherOptions",
    "GroupMember",
    "ProcessGroup",
    "ProcessGroupGloo",
    "ProcessGroupMPI",
    "ProcessGroupNCCL",
    "ProcessGroupUCC",
    "ReduceOp",
    "ReduceOptions",
    "ReduceScatterOptions",
    "ScatterOptions",
    "Work",
    "_DistributedBackendOptions",
    "_ProcessGroupWrapper",
    "_broadcast_coalesced",
    "_hash_tensors",
    "_make_nccl_premul_sum",
    "_register_process_group",
    "_resolve_process_group",
    "_set_global_rank",
    "_test_python_store",
    "_unregister_all_process_groups",
    "_unregister_process_group",
    "_verify_params_across_processes",
    "get_debug_level",
    "group",
    "set_debug_level",
    "set_debug_level_from_env",
]


def _unavailable(backend: str) -> NoReturn:
    raise RuntimeError(
        f"ProcessGroup{backend} is not available: torch {torch.__version__} was built without "
        f"{backend} (torch.distributed.is_{backend.lower()}_available() is False); "
        "use the gloo backend on CPU or nccl on CUDA"
    )


class _UnavailableUCC:
    """Stand-in for ``ProcessGroupUCC`` in torch builds without UCC: constructing it raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _unavailable("UCC")


class _UnavailableMPI:
    """Stand-in for ``ProcessGroupMPI`` in torch builds without MPI: ``create`` raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _unavailable("MPI")

    @staticmethod
    def create(ranks: list[int]) -> NoReturn:
        """Would build an MPI group over ``ranks``; this torch has no MPI, so it raises."""
        _unavailable("MPI")


ProcessGroupUCC: Any = getattr(_tdist, "ProcessGroupUCC", _UnavailableUCC)
"""torch's ``ProcessGroupUCC`` where this torch has it, else a stand-in that raises."""

ProcessGroupMPI: Any = getattr(_tdist, "ProcessGroupMPI", _UnavailableMPI)
"""torch's ``ProcessGroupMPI`` where this torch has it, else a stand-in that raises."""
