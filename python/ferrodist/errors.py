"""ferrodist's exception classes.

Each class inherits both ferrodist's base and the class a ``torch.distributed`` user already
catches, so ``except torch.distributed.DistStoreError`` (or ``except TimeoutError``) catches
ferrodist's errors unchanged. The Rust core maps its one ``Error`` enum onto these classes in one
place (``rust/python/errors.rs``).
"""

from __future__ import annotations

import torch.distributed as _tdist

__all__ = [
    "AuthenticationError",
    "ConnectionClosedError",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "FerrodistError",
    "InvalidArgumentError",
    # --- collectives ---
    "InvalidInputError",
    "NetworkTimeoutError",
    "QueueEmptyError",
    "StoreTimeoutError",
]


class FerrodistError(Exception):
    """Base class of every ferrodist error."""


class DistError(FerrodistError, _tdist.DistError):
    """A distributed failure; also a ``torch.distributed.DistError`` (a ``RuntimeError``)."""


class DistStoreError(DistError, _tdist.DistStoreError):
    """A store operation failed; also a ``torch.distributed.DistStoreError``."""


class DistNetworkError(DistError, _tdist.DistNetworkError):
    """A network step failed; also a ``torch.distributed.DistNetworkError``."""


class DistBackendError(DistError, _tdist.DistBackendError):
    """A backend (gloo, NCCL) failed; also a ``torch.distributed.DistBackendError``."""


# Where torch has its own class (2.11 does), ours inherits it too; 2.4 has no store queues.
_TORCH_QUEUE_EMPTY: tuple[type, ...] = (
    (_tdist.QueueEmptyError,) if hasattr(_tdist, "QueueEmptyError") else ()
)


class QueueEmptyError(DistStoreError, *_TORCH_QUEUE_EMPTY):  # type: ignore[misc]
    """A non-blocking ``queue_pop`` found the queue empty (also torch's, where it has one)."""


class InvalidArgumentError(DistStoreError, ValueError):
    """An argument, or a stored value, that the operation cannot use (``multi_set`` with more
    keys than values, ``add`` on a value that is not an integer, a rank outside the world, a
    sparse tensor in a bucket assignment).

    A ``ValueError`` whose message names what was wrong, and also a ``DistStoreError`` (so a
    ``RuntimeError``): torch's TCPStore raises that class for its store arguments and torch's
    collectives and bucketing a ``RuntimeError``, so both ``except ValueError`` and torch's
    ``except`` clauses catch it.
    """


class AuthenticationError(DistStoreError):
    """A store server refused this client: it requires an auth token and the client has none,
    or a different one (``TCPStore(auth_token=...)``, ``FERRODIST_STORE_TOKEN``). Raised at
    once, never retried into a timeout; the message names the store, never the token.
    """


class StoreTimeoutError(DistStoreError, TimeoutError):
    """A blocking store call passed its deadline; the message names what never arrived.

    Caught by ``except torch.distributed.DistStoreError`` (as torch's own timeouts are) and by
    ``except TimeoutError``.
    """


class NetworkTimeoutError(DistNetworkError, TimeoutError):
    """A network step passed its deadline: connecting to the store, or a reply that never came.

    A ``torch.distributed.DistNetworkError``, as torch raises for its connect timeout, and a
    ``TimeoutError``, so code that catches either sees it.
    """


class ConnectionClosedError(DistNetworkError, ConnectionError):
    """The peer closed the connection or the store was shut down."""


# --- collectives ---
InvalidInputError = InvalidArgumentError
"""The former name of :class:`InvalidArgumentError` for collective and bucketing arguments,
kept so existing ``except ferrodist.InvalidInputError`` clauses still catch them."""
