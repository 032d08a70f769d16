"""ferrodist's stores, as ``torch.distributed.Store`` subclasses.

Each public store is a Python subclass of ``torch.distributed.Store`` that delegates every call
to a native (Rust) store. Being a real ``torch.distributed.Store`` is what lets torch take it:
``init_process_group(store=...)``, ``torch.distributed.PrefixStore(...)``, ``new_group()``.
torch reaches the overrides through its C++ trampoline, so its own code paths run ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TypeVar, Union

import torch.distributed as _tdist

from ferrodist import _native
from ferrodist.stores import _lifetime
from ferrodist.stores._kinship import KinChecks, kin, pair_torch_classes

__all__ = ["HashStore", "Store"]

Store = _tdist.Store
"""The store base class, shared with torch: ``isinstance(s, ferrodist.Store)`` holds for torch's
stores and ferrodist's alike."""

_Value = Union[str, bytes]
_Key = Union[str, bytes]
"""A key, as torch takes it: text, or bytes holding UTF-8 text."""
_S = TypeVar("_S", bound="_NativeBackedStore")


class _NativeBackedStore(_tdist.Store):
    """A ``torch.distributed.Store`` whose every method runs in ferrodist's Rust core."""

    def __init__(self, native: _native.NativeStore) -> None:
        super().__init__()
        # What a first store needs of torch, done here rather than at import (importing ferrodist
        # changes nothing of torch's): torch's store classes count ferrodist's instances, and the
        # check _lifetime makes from __del__ is ready. Each is a flag test after the first store.
        pair_torch_classes()
        _lifetime.prepare()
        self._native = native
        super().set_timeout(native.timeout)

    def __del__(self) -> None:
        # torch may still hold this store from C++ (torch issue #120843): see _lifetime.py.
        _lifetime.keep_alive_while_shared(self)

    def set(self, key: _Key, value: _Value) -> None:
        self._native.set(key, value)

    def get(self, key: _Key) -> bytes:
        return self._native.get(key)

    def add(self, key: _Key, value: int) -> int:
        return self._native.add(key, value)

    def compare_set(self, key: _Key, expected_value: _Value, desired_value: _Value) -> bytes:
        return self._native.compare_set(key, expected_value, desired_value)

    def check(self, keys: Sequence[_Key]) -> bool:
        return self._native.check(keys)

    def wait(self, keys: Sequence[_Key], timeout: timedelta | None = None) -> None:
        self._native.wait(keys, timeout)

    def delete_key(self, key: _Key) -> bool:
        return self._native.delete_key(key)

    def num_keys(self) -> int:
        return self._native.num_keys()

    def append(self, key: _Key, value: _Value) -> None:
        self._native.append(key, value)

    def multi_get(self, keys: Sequence[_Key]) -> list[bytes]:
        return self._native.multi_get(keys)

    def multi_set(self, keys: Sequence[_Key], values: list[_Value]) -> None:
        self._native.multi_set(keys, values)

    def queue_push(self, key: _Key, value: _Value) -> None:
        self._native.queue_push(key, value)

    def queue_pop(self, key: _Key, block: bool = True) -> bytes:
        return self._native.queue_pop(key, block)

    def queue_len(self, key: _Key) -> int:
        return self._native.queue_len(key)

    def list_keys(self) -> list[str]:
        return self._native.list_keys()

    def barrier(self, key: _Key, world_size: int, timeout: timedelta | None = None) -> None:
        self._native.barrier(key, world_size, timeout)

    def set_timeout(self, timeout: timedelta) -> None:
        self._native.set_timeout(timeout)
        super().set_timeout(self._native.timeout)

    @property
    def timeout(self) -> timedelta:
        return self._native.timeout

    def has_extended_api(self) -> bool:
        return self._native.has_extended_api()

    def clone(self) -> _NativeBackedStore:
        return type(self)._from_native(self._native.clone())

    @classmethod
    def _from_native(cls: type[_S], native: _native.NativeStore) -> _S:
        store = cls.__new__(cls)
        _NativeBackedStore.__init__(store, native)
        return store


class HashStore(_NativeBackedStore, metaclass=KinChecks):
    """An in-process store, as ``torch.distributed.HashStore``.

    Example::

        >>> store = ferrodist.HashStore()
        >>> store.set("k", "v")
        >>> store.get("k")
        b'v'
    """

    def __init__(self) -> None:
        super().__init__(_native.hash_store())

    def clone(self) -> HashStore:
        """The store itself, as torch's ``HashStore.clone()`` returns the same object."""
        return self


kin(HashStore, _tdist.HashStore)
