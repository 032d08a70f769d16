"""``ferrodist.PrefixStore``: a key namespace over any store, as ``torch.distributed.PrefixStore``.

The underlying store may be ferrodist's (then the prefixing runs entirely in Rust) or any other
``torch.distributed.Store`` (torch's ``TCPStore``, ``FileStore``, ``HashStore``, a user's
subclass), reached through ferrodist's foreign-store adapter.
"""

from __future__ import annotations

import torch.distributed as _tdist

from ferrodist import _native
from ferrodist.stores._kinship import KinChecks, kin
from ferrodist.stores.base import _NativeBackedStore

__all__ = ["PrefixStore"]


class PrefixStore(_NativeBackedStore, metaclass=KinChecks):
    """Every key ``k`` becomes ``prefix + "/" + k`` in ``store``.

    Args:
        prefix (str): the namespace.
        store (torch.distributed.Store): the store that holds the keys.

    ``num_keys()`` counts every key of the underlying store and ``timeout`` is the underlying
    store's, as in torch.
    """

    def __init__(self, prefix: str, store: _tdist.Store) -> None:
        if store is None:
            raise ValueError("store argument cannot be None")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        if not isinstance(store, _tdist.Store):
            raise TypeError(f"store must be a torch.distributed.Store, not {type(store).__name__}")
        native = (
            store._native if isinstance(store, _NativeBackedStore) else _native.wrap_store(store)
        )
        super().__init__(_native.prefix_store(prefix, native))
        self._prefix = prefix
        self._underlying = store

    @property
    def underlying_store(self) -> _tdist.Store:
        """The store this one writes into."""
        return self._underlying

    @property
    def _underlying_non_prefix_store(self) -> _tdist.Store:
        """The innermost store below every layer of prefix stores (ours or torch's)."""
        store: _tdist.Store = self._underlying
        while isinstance(store, (PrefixStore, _tdist.PrefixStore)):
            store = store.underlying_store
        return store

    def clone(self) -> PrefixStore:
        """The same prefix over a clone of the underlying store."""
        underlying: _tdist.Store = self._underlying.clone()  # type: ignore[attr-defined]
        return PrefixStore(self._prefix, underlying)


kin(PrefixStore, _tdist.PrefixStore)
