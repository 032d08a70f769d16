"""``torch.distributed`` names that ferrodist hands out unchanged.

ferrodist's process groups are torch's own (see ``ferrodist.c10d``), so whatever torch builds on
them works with groups ferrodist made: device meshes, the rank-0 debugger ``breakpoint``, torch's
submodules (``distributed_c10d``, ``rpc``, ...). Re-exporting them completes
``import ferrodist as dist`` as a drop-in. ``register_rendezvous_handler`` is torch's registry,
and ferrodist's ``init_process_group`` uses the handlers registered in it for any scheme other
than ``env://``, ``tcp://`` and ``file://``.

The names torch added after 2.4 are re-exported only where the installed torch has them.
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

_IF_PRESENT = [
    "RankType",
    "autograd",
    "c10d_logger",
    "config",
    "is_xccl_available",
    "logging_handlers",
    "record_comm",
    "reduce_op",
    "remote_device",
    "rpc",
    "shrink_group",
]
for _name in _IF_PRESENT:
    if hasattr(_tdist, _name):
        globals()[_name] = getattr(_tdist, _name)
        __all__ += [_name]
