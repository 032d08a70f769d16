"""``ferrodist.EtcdStore``: a torch store whose keys live in an etcd cluster.

A ``TCPStore`` lives and dies with one process; an etcd cluster of three or five members keeps
every acknowledged write through the loss of any minority of them, so a job's rendezvous
survives the host that would have served it. The store is a real ``torch.distributed.Store``
(torch takes it anywhere it takes a store) and answers as torch's stores do; where torch's own
stores disagree it answers as ``HashStore`` (see the README).

Every call has a deadline (waits their timeout, the rest the store timeout), retries through
etcd leader elections, and never holds the GIL while it waits. ``wait`` and ``get`` watch etcd
from the revision they read, so they wake on the write that completes them without polling.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from datetime import timedelta
from typing import Optional, Union

from ferrodist import _native
from ferrodist._redact import redact_url
from ferrodist.stores.base import _NativeBackedStore

__all__ = ["EtcdStore"]

_PathLike = Union[str, "os.PathLike[str]"]


def _endpoints(endpoints: object) -> list[str]:
    if isinstance(endpoints, str):
        items = [e.strip() for e in endpoints.split(",")]
    elif isinstance(endpoints, Sequence) and all(isinstance(e, str) for e in endpoints):
        items = [str(e).strip() for e in endpoints]
    else:
        raise TypeError(
            "EtcdStore(): argument 'endpoints' must be a str ('host:port,host:port') or a list "
            f"of str, not {type(endpoints).__name__}"
        )
    if not items or any(not e for e in items):
        raise ValueError(
            "EtcdStore(): argument 'endpoints' must name at least one host:port, got "
            f"{[redact_url(e) for e in items]!r}"
        )
    return items


def _optional_path(name: str, value: object) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)  # type: ignore[arg-type]
    raise TypeError(f"EtcdStore(): argument '{name}' must be a path, not {type(value).__name__}")


def _optional_str(name: str, value: object) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"EtcdStore(): argument '{name}' must be str, not {type(value).__name__}")


RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
"""What torchrun tells its workers the run is called (``--rdzv-id``; a fresh uuid with
``--standalone``); a store given no prefix takes its job prefix from it."""

_NO_RUN_ID = ("", "none")
"""Run ids that name no run: unset, and torchrun's default ``--rdzv-id`` (every run without one
has it)."""


def _job_prefix(prefix: Optional[str]) -> str:
    """``prefix`` (checked in the core), else ``ferrodist/RUN_ID`` from torchrun, else an error:
    a prefix every unrelated job would get too (the old default, ``"ferrodist"``) is no default.
    """
    if prefix is not None:
        return prefix
    run_id = os.environ.get(RUN_ID_ENV, "")
    if run_id in _NO_RUN_ID:
        told = f"{RUN_ID_ENV}={run_id!r}" if run_id else f"no {RUN_ID_ENV}"
        raise ValueError(
            f"EtcdStore(): argument 'prefix' is needed here ({told}: not a torchrun run with "
            "its own --rdzv-id): name the job, e.g. EtcdStore(endpoints, 'job-42'), with a "
            "prefix no other job on the cluster uses; without one, unrelated jobs would share "
            "keys and one job's purge() would delete the others'"
        )
    derived = f"ferrodist/{run_id}"
    try:
        _native.check_etcd_prefix(derived)
    except ValueError as err:
        raise ValueError(
            f"EtcdStore(): argument 'prefix' omitted and {RUN_ID_ENV} ({run_id!r}) does not "
            f"make one ({err}); pass a prefix, or a --rdzv-id of letters, digits, '.', '_', '-'"
        ) from None
    return derived


class EtcdStore(_NativeBackedStore):
    """A store on an etcd cluster (etcd's v3 API), usable wherever torch takes a store.

    Args:
        endpoints: the members, as ``"host:port,host:port"`` or a list of ``host:port`` (or
            ``http://`` / ``https://`` URLs).
        prefix: the job's prefix: one or more segments of ASCII letters, digits, ``.``,
            ``_`` and ``-`` joined by single ``/`` (``"job-42"``, ``"team/run-7"``). Every key
            lives under ``prefix:`` in etcd; no prefix contains a ``:``, so no job's keys lie
            in another's range (not even ``"a"`` and ``"a/b"``): jobs sharing a cluster never
            see each other's keys, and :meth:`purge` removes one finished job and nothing
            else. Omitted, it is the job's own: ``"ferrodist/RUN_ID"`` under torchrun (its
            ``TORCHELASTIC_RUN_ID``: ``--rdzv-id``, or the id ``--standalone`` draws), so
            every rank of a run shares it and no other run does. Outside torchrun, or with
            torchrun's placeholder run id ``"none"`` (no ``--rdzv-id``), there is nothing
            unique to the job to take: a ``ValueError`` asks for a prefix rather than let
            unrelated jobs share keys (and one job's :meth:`purge` wipe another's).
        timeout: default timeout of blocking calls (``get``, ``wait``, ...) and the deadline of
            every other call (a zero timeout waits forever, other calls then get 300 s).
        username, password: etcd auth, when the cluster has it enabled. A user name needs a
            password: ``password``, else the file ``password_file`` names, else the
            environment variable ``FERRODIST_ETCD_PASSWORD``; none (or an empty one) is a
            ``ValueError``. Credentials are sent only over TLS (``ca_file`` or ``https://``
            endpoints).
        ca_file: PEM bundle of the CA that signed the members' certificates (turns on TLS).
        cert_file, key_file: a client certificate and its key, for clusters that require one.
        tls_domain: the name to check the members' certificates against, if not the host.
        password_file: a file holding the password (one trailing newline is dropped).
        insecure_plaintext_credentials: let the user name and password (and etcd's token after
            them) go to a plain ``http`` endpoint, readable by anyone on the path. Without it
            such a store is refused with a ``ValueError``.

    Raises:
        DistNetworkError: no member could be reached before ``timeout``.
        ValueError: an empty endpoint list, an invalid ``prefix`` or none where no run id
            names the job (see above), a TLS file that cannot be read, a refused login, a
            user name without a password, credentials without TLS (see above), an endpoint
            with ``user:password@`` in it.

    Example::

        >>> store = ferrodist.EtcdStore("127.0.0.1:2379", "job-42")
        >>> store.set("k", "v")
        >>> store.get("k")
        b'v'
        >>> store.purge()  # once the job is done
    """

    def __init__(
        self,
        endpoints: Union[str, Sequence[str]],
        prefix: Optional[str] = None,
        timeout: timedelta = timedelta(seconds=300),
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        ca_file: Optional[_PathLike] = None,
        cert_file: Optional[_PathLike] = None,
        key_file: Optional[_PathLike] = None,
        tls_domain: Optional[str] = None,
        password_file: Optional[_PathLike] = None,
        insecure_plaintext_credentials: bool = False,
    ) -> None:
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(
                f"EtcdStore(): argument 'prefix' must be str, not {type(prefix).__name__}"
            )
        if not isinstance(timeout, timedelta):
            raise TypeError(
                f"EtcdStore(): argument 'timeout' must be timedelta, not {type(timeout).__name__}"
            )
        members = _endpoints(endpoints)
        handle = _native.etcd_store(
            members,
            _job_prefix(prefix),
            timeout,
            _optional_str("username", username),
            _optional_str("password", password),
            _optional_path("ca_file", ca_file),
            _optional_path("cert_file", cert_file),
            _optional_path("key_file", key_file),
            _optional_str("tls_domain", tls_domain),
            _optional_path("password_file", password_file),
            bool(insecure_plaintext_credentials),
        )
        plaintext = handle.plaintext_credentials_endpoint
        if plaintext is not None:
            warnings.warn(
                f"EtcdStore: the etcd user name and password went to {plaintext} without TLS "
                "(insecure_plaintext_credentials): anyone on the network path can read them",
                RuntimeWarning,
                stacklevel=2,
            )
        self._adopt(handle)

    def _adopt(self, handle: _native.EtcdStoreHandle) -> None:
        super().__init__(handle.store())
        self._handle = handle

    @property
    def prefix(self) -> str:
        """The job prefix every key lives under."""
        return self._handle.prefix

    @property
    def endpoints(self) -> list[str]:
        """The members, as given."""
        return self._handle.endpoints

    def purge(self) -> int:
        """Deletes every key of the job from etcd (values, queues, bookkeeping) and returns how
        many etcd keys went. Call it once the job is over; etcd keeps keys until deleted."""
        return self._handle.purge()

    def clone(self) -> EtcdStore:
        """A new handle on the same store and connection, with its own timeout."""
        store = EtcdStore.__new__(EtcdStore)
        _NativeBackedStore.__init__(store, self._native.clone())
        store._handle = self._handle
        return store

    def __repr__(self) -> str:
        return f"ferrodist.EtcdStore(endpoints={self.endpoints!r}, prefix={self.prefix!r})"
