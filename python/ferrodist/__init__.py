"""ferrodist: a faster, safer ``torch.distributed``.

``import ferrodist as dist`` in place of ``import torch.distributed as dist``. Every name that
mirrors a torch name takes the same arguments, returns the same types and raises errors the same
``except`` clauses catch.
"""

from __future__ import annotations

from ferrodist import _native

# --- collectives ---
from ferrodist.bucketing import (
    compute_bucket_assignment_by_size,
    compute_bucket_assignment_by_size_from_metadata,
)
from ferrodist.collectives import StoreCollectives
from ferrodist.errors import (
    ConnectionClosedError,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistStoreError,
    FerrodistError,
    InvalidInputError,
    QueueEmptyError,
    StoreTimeoutError,
)
from ferrodist.file_store import FileStore  # --- file and prefix stores ---
from ferrodist.prefix_store import PrefixStore  # --- file and prefix stores ---
from ferrodist.store import HashStore, Store

# --- tcp store ---
from ferrodist.tcp_store import TCPStore

__version__: str = _native.__version__

__all__ = [
    "ConnectionClosedError",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "FerrodistError",
    "FileStore",  # --- file and prefix stores ---
    "HashStore",
    # --- collectives ---
    "InvalidInputError",
    "PrefixStore",  # --- file and prefix stores ---
    "QueueEmptyError",
    "Store",
    "StoreCollectives",
    "StoreTimeoutError",
    "TCPStore",
    "__version__",
    "compute_bucket_assignment_by_size",
    "compute_bucket_assignment_by_size_from_metadata",
]

# --- process groups ---
# `import ferrodist as dist` in place of `import torch.distributed as dist`: groups, collectives
# and the c10d types (ferrodist.c10d, .ops, .process_group, ._round_robin).
from ferrodist import _round_robin, c10d, ops, process_group
from ferrodist._round_robin import *  # noqa: F403
from ferrodist.c10d import *  # noqa: F403
from ferrodist.ops import *  # noqa: F403
from ferrodist.process_group import *  # noqa: F403

__all__ += [*c10d.__all__, *ops.__all__, *process_group.__all__, *_round_robin.__all__]
# --- ddp ---
from ferrodist.ddp import (
    BuiltinCommHookType,
    GradBucket,
    Logger,
    Reducer,
    _register_builtin_comm_hook,
    _register_comm_hook,
)

__all__ += [
    "BuiltinCommHookType",
    "GradBucket",
    "Logger",
    "Reducer",
    "_register_builtin_comm_hook",
    "_register_comm_hook",
]
# --- end ddp ---
