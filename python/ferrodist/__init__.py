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
from ferrodist.store import HashStore, Store

__version__: str = _native.__version__

__all__ = [
    "ConnectionClosedError",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "FerrodistError",
    "HashStore",
    # --- collectives ---
    "InvalidInputError",
    "QueueEmptyError",
    "Store",
    "StoreTimeoutError",
    "__version__",
    "compute_bucket_assignment_by_size",
    "compute_bucket_assignment_by_size_from_metadata",
]
