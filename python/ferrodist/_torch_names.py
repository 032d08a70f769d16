"""``torch.distributed`` names that ferrodist hands out unchanged.

ferrodist's process groups are torch's own (see ``ferrodist.c10d``), so whatever torch builds on
them works with groups ferrodist made: device meshes, the rank-0 debugger ``breakpoint``, torch's
submodules (``distributed_c10d``, ``rpc``, ...). Re-exporting them completes
``import ferrodist as dist`` as a drop-in. ``register_rendezvous_handler`` is torch's registry,
and ferrodist's ``init_process_group`` uses the handlers registered in it for any scheme other
than ``env://``, ``tcp://`` and ``file://``.

Names that only some torch versions have (added after 2.4, like ``split_group``, or after
2.13, like ``gather_into_tensor``; or dropped, like 2.4's ``ProcessGroupCudaP2P``) are listed in
``VERSION_SPECIFIC`` and re-exported only where the installed torch has them, so
``hasattr(ferrodist, name) == hasattr(torch.distributed, name)`` on every supported torch.
"""

from __future__ import annotations

import torch.distributed as _tdist
from torch.distributed import (
    DeviceMesh,
    breakpoint,
    constants,
    device_mesh,
    distributed_c10d,
    init_device_mesh,
    register_rendezvous_handler,
    utils,
)

__all__ = [
    "DeviceMesh",
    "breakpoint",
    "constants",
    "device_mesh",
    "distributed_c10d",
    "init_device_mesh",
    "register_rendezvous_handler",
    "utils",
]

VERSION_SPECIFIC = [
    "GroupName",
    "ProcessGroupCudaP2P",
    "ProcessGroupNCCL2",
    "ProcessGroupNCCLLazy",
    "RankType",
    "all_gather_single",
    "autograd",
    "c10d_logger",
    "config",
    "gather_into_tensor",
    "gather_single",
    "get_backend_impl",
    "get_default_backend_for_device",
    "is_xccl_available",
    "logging_handlers",
    "record_comm",
    "reduce_op",
    "remote_device",
    "rpc",
    "set_timeout",
    "shrink_group",
    "split_group",
]
"""torch.distributed names that exist in some supported torch versions and not others."""

for _name in VERSION_SPECIFIC:
    if hasattr(_tdist, _name):
        globals()[_name] = getattr(_tdist, _name)
        __all__ += [_name]
