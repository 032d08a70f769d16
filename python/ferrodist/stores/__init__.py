"""ferrodist's stores: ``torch.distributed.Store`` subclasses that run every call in the Rust core.

``base`` holds the shared delegating class and ``HashStore``; ``tcp``, ``file``, ``prefix`` and
``etcd`` one store each; ``_kinship`` makes each class and the torch class it mirrors count each
other's instances; ``_lifetime`` keeps a store alive while torch's C++ still holds it. The package
root (``ferrodist.TCPStore`` and the rest) re-exports each class.
"""

from __future__ import annotations

from ferrodist.stores.base import HashStore, Store
from ferrodist.stores.etcd import EtcdStore
from ferrodist.stores.file import FileStore
from ferrodist.stores.prefix import PrefixStore
from ferrodist.stores.tcp import TCPStore

__all__ = ["EtcdStore", "FileStore", "HashStore", "PrefixStore", "Store", "TCPStore"]
