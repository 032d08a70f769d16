"""ferrodist: a faster, safer ``torch.distributed``.

``import ferrodist as dist`` in place of ``import torch.distributed as dist``. Every name that
mirrors a torch name takes the same arguments, returns the same types and raises errors the same
``except`` clauses catch.

The namespace is built in two layers: first the process-group API (groups, collectives, the
c10d types; torch's own objects wherever ferrodist adds nothing), then ferrodist's own pieces
(stores, errors, store collectives, bucket assignment, the DDP reducer), which take precedence
over any torch name they mirror.
"""

# isort: skip_file
# (Import order matters: ferrodist's own names must come after the star imports.)
from __future__ import annotations

# Process groups: groups, collectives and the c10d types (ferrodist.c10d, .ops,
# .process_group, ._round_robin).
from ferrodist import _round_robin, _torch_names, c10d, ops, process_group
from ferrodist._round_robin import *  # noqa: F403
from ferrodist._torch_names import *  # noqa: F403
from ferrodist.c10d import *  # noqa: F403
from ferrodist.ops import *  # noqa: F403
from ferrodist.process_group import *  # noqa: F403

# ferrodist's own pieces; imported after the star imports so they win over torch's names.
from ferrodist import _native, algorithms
from ferrodist.bucketing import (
    compute_bucket_assignment_by_size,
    compute_bucket_assignment_by_size_from_metadata,
)
from ferrodist.collectives import StoreCollectives
from ferrodist.ddp import (
    BuiltinCommHookType,
    GradBucket,
    Logger,
    Reducer,
    _register_builtin_comm_hook,
    _register_comm_hook,
)
from ferrodist.errors import (
    AuthenticationError,
    ConnectionClosedError,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistStoreError,
    FerrodistError,
    InvalidArgumentError,
    InvalidInputError,
    NetworkTimeoutError,
    QueueEmptyError,
    StoreTimeoutError,
)
from ferrodist.rdzv import rendezvous
from ferrodist.stores import EtcdStore, FileStore, HashStore, PrefixStore, Store, TCPStore

__version__: str = _native.__version__

__all__ = [
    "AuthenticationError",
    "BuiltinCommHookType",
    "ConnectionClosedError",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "EtcdStore",
    "FerrodistError",
    "FileStore",
    "GradBucket",
    "HashStore",
    "InvalidArgumentError",
    "InvalidInputError",
    "Logger",
    "NetworkTimeoutError",
    "PrefixStore",
    "QueueEmptyError",
    "Reducer",
    "Store",
    "StoreCollectives",
    "StoreTimeoutError",
    "TCPStore",
    "__version__",
    "_register_builtin_comm_hook",
    "_register_comm_hook",
    "algorithms",
    "compute_bucket_assignment_by_size",
    "compute_bucket_assignment_by_size_from_metadata",
    "rendezvous",
]
__all__ += sorted(
    (
        set(c10d.__all__)
        | set(ops.__all__)
        | set(process_group.__all__)
        | set(_round_robin.__all__)
        | set(_torch_names.__all__)
    )
    - set(__all__)
)
