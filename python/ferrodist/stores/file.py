"""``ferrodist.FileStore``: torch's ``FileStore`` with the same file format, faster and safer.

A torch ``FileStore`` and a ferrodist ``FileStore`` can share one file, in either direction
and across processes: both read and write torch's record log under the same ``flock`` locks,
and both remove the file when the last instance of a finished world closes it. ferrodist's
writes cannot leave half a record behind a killed process, and a file that is not a store
raises ``DistStoreError`` instead of hanging.
"""

from __future__ import annotations

import operator

import torch.distributed as _tdist

from ferrodist import _native
from ferrodist.stores._kinship import KinChecks, kin
from ferrodist.stores.base import _NativeBackedStore

__all__ = ["FileStore"]


class FileStore(_NativeBackedStore, metaclass=KinChecks):
    """A store in a file, as ``torch.distributed.FileStore(file_name, world_size=-1)``.

    Args:
        file_name (str): path of the store file; created if missing.
        world_size (int): number of processes using the store. With ``-1`` (the default) the
            file is never removed; otherwise the last instance to close it removes it once
            ``world_size`` instances have closed.

    Example::

        >>> store = ferrodist.FileStore("/tmp/rdzv", 2)
        >>> store.set("k", "v")
        >>> store.get("k")
        b'v'
    """

    def __init__(self, file_name: str, world_size: int = -1) -> None:
        if not isinstance(file_name, str):
            raise TypeError(f"file_name must be a str, not {type(file_name).__name__}")
        if isinstance(world_size, bool):
            raise TypeError("world_size must be an int, not bool")
        try:
            world_size = operator.index(world_size)
        except TypeError:
            raise TypeError(f"world_size must be an int, not {type(world_size).__name__}") from None
        super().__init__(_native.file_store(file_name, world_size))
        self._path = file_name

    @property
    def path(self) -> str:
        """Path of the store file."""
        return self._path

    def clone(self) -> FileStore:
        """A new instance on the same file (it counts as one more user of the file)."""
        store = FileStore._from_native(self._native.clone())
        store._path = self._path
        return store


kin(FileStore, _tdist.FileStore)
