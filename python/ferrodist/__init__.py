"""ferrodist: a faster, safer ``torch.distributed``.

``import ferrodist as dist`` in place of ``import torch.distributed as dist``. Every name that
mirrors a torch name takes the same arguments, returns the same types and raises errors the same
``except`` clauses catch.
"""

from __future__ import annotations

from ferrodist import _native
from ferrodist.errors import (
    ConnectionClosedError,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistStoreError,
    FerrodistError,
    QueueEmptyError,
    StoreTimeoutError,
)
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
    "HashStore",
    "QueueEmptyError",
    "Store",
    "StoreTimeoutError",
    "TCPStore",
    "__version__",
]
