"""Control-plane collectives over a store, as ``torch.distributed._StoreCollectives``.

``StoreCollectives(store, rank, world_size)`` has torch's methods, arguments, results and store
key layout, so ranks using torch's class and ranks using this one can meet in one collective on
one store. The logic runs in Rust (``rust/collectives.rs``) over any ferrodist store, or over
any other ``torch.distributed.Store`` (torch's ``TCPStore``, ``FileStore``, a user's subclass)
through an adapter.

What is better than torch:

* the ``timeout`` covers the whole call, sends included (torch applies it to each store
  operation, by changing the timeout of the shared store object): a send whose write the store
  has not taken in time raises :class:`ferrodist.StoreTimeoutError`;
* over any store: a torch ``TCPStore`` whose own timeout is longer does not stretch it (a
  receive is the store's ``wait`` with the time left, then its ``get``), and each wait is one
  call of the store's ``wait``, not slices of it (torch's client logs a warning per slice);
* a gather waits once for all keys and reads them with one ``multi_get``;
* a timeout raises :class:`ferrodist.StoreTimeoutError` (a ``torch.distributed.DistStoreError``,
  so also a ``RuntimeError``) with torch's text, ``barrier failed -- missing ranks: 0, 2, ...``,
  naming exactly the ranks still missing; a rank that arrives as the timeout fires counts;
* wrong arguments (a rank outside the world, a scatter list of the wrong length) raise
  ``ValueError`` instead of reading out of bounds.

Example::

    >>> store = ferrodist.HashStore()
    >>> solo = ferrodist.StoreCollectives(store, rank=0, world_size=1)
    >>> solo.all_gather("hello", b"x")
    [b'x']
"""

from __future__ import annotations

from datetime import timedelta
from typing import Union

import torch.distributed as _tdist

from ferrodist import _native

__all__ = ["StoreCollectives"]

_Data = Union[str, bytes]
_Timeout = Union[timedelta, float]
_DEFAULT_TIMEOUT = timedelta(minutes=5)


def _native_handle(store: _tdist.Store) -> _native.NativeStore:
    """The store's own native handle when it is a ferrodist store, else an adapter."""
    own = getattr(store, "_native", None)
    if isinstance(own, _native.NativeStore):
        return own
    if isinstance(store, _native.NativeStore):
        return store
    if not isinstance(store, _tdist.Store):
        raise TypeError(f"store: expected a torch.distributed.Store, got {type(store).__name__}")
    return _native.wrap_store(store)


class StoreCollectives:
    """Collectives for rank ``rank`` of ``world_size`` over ``store`` (torch's
    ``_StoreCollectives``). Each ``key`` may be used once per instance; results are ``bytes``.
    """

    def __init__(self, store: _tdist.Store, rank: int, world_size: int) -> None:
        self._store = store
        self._impl = _native.StoreCollectives(_native_handle(store), rank, world_size)

    @property
    def rank(self) -> int:
        """This rank."""
        return self._impl.rank

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self._impl.world_size

    def barrier(self, key: str, timeout: _Timeout = _DEFAULT_TIMEOUT, block: bool = True) -> None:
        """Wait until all ranks reach ``key``; with ``block=False`` only announce this rank."""
        self._impl.barrier(key, timeout, block)

    def broadcast_send(self, key: str, data: _Data, timeout: _Timeout = _DEFAULT_TIMEOUT) -> None:
        """Root: publish ``data`` to every rank (does not wait for receivers)."""
        self._impl.broadcast_send(key, data, timeout)

    def broadcast_recv(self, key: str, timeout: _Timeout = _DEFAULT_TIMEOUT) -> bytes:
        """Non-root: the data the root published under ``key``."""
        return self._impl.broadcast_recv(key, timeout)

    def gather_send(self, key: str, data: _Data, timeout: _Timeout = _DEFAULT_TIMEOUT) -> None:
        """Non-root: contribute ``data`` to the gather at the root."""
        self._impl.gather_send(key, data, timeout)

    def gather_recv(
        self, key: str, data: _Data, timeout: _Timeout = _DEFAULT_TIMEOUT
    ) -> list[bytes]:
        """Root: every rank's data in rank order, ``data`` (this rank's own) included."""
        return self._impl.gather_recv(key, data, timeout)

    def scatter_send(
        self, key: str, data: list[_Data], timeout: _Timeout = _DEFAULT_TIMEOUT
    ) -> bytes:
        """Root: send ``data[i]`` to rank ``i``; returns this rank's own element."""
        return self._impl.scatter_send(key, data, timeout)

    def scatter_recv(self, key: str, timeout: _Timeout = _DEFAULT_TIMEOUT) -> bytes:
        """Non-root: this rank's element of the scatter."""
        return self._impl.scatter_recv(key, timeout)

    def all_gather(
        self, key: str, data: _Data, timeout: _Timeout = _DEFAULT_TIMEOUT
    ) -> list[bytes]:
        """Every rank's data in rank order."""
        return self._impl.all_gather(key, data, timeout)

    def all_sum(self, key: str, data: int, timeout: _Timeout = _DEFAULT_TIMEOUT) -> int:
        """The sum of ``data`` over all ranks (uses ``key`` and ``key/barrier``)."""
        return self._impl.all_sum(key, data, timeout)
