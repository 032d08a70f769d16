"""DDP on ferrodist: the Reducer, its buckets and hooks, and ``DistributedDataParallel``.

``ferrodist.Reducer``, ``GradBucket``, ``Logger``, ``BuiltinCommHookType``,
``_register_comm_hook`` and ``_register_builtin_comm_hook`` mirror the names torch exposes on
``torch.distributed``; ``ferrodist.nn.DistributedDataParallel`` mirrors torch's module.
"""

from __future__ import annotations

from ferrodist.ddp.comm_hook import BuiltinCommHookType
from ferrodist.ddp.data_parallel import DistributedDataParallel
from ferrodist.ddp.grad_bucket import GradBucket
from ferrodist.ddp.logger import Logger
from ferrodist.ddp.reducer import Reducer
from ferrodist.ddp.registration import _register_builtin_comm_hook, _register_comm_hook

__all__ = [
    "BuiltinCommHookType",
    "DistributedDataParallel",
    "GradBucket",
    "Logger",
    "Reducer",
    "_register_builtin_comm_hook",
    "_register_comm_hook",
]
