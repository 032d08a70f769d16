"""``ferrodist.TCPStore``: torch's ``TCPStore``, with a Rust server and client underneath.

It speaks torch's wire protocol both ways: a stock ``torch.distributed.TCPStore`` client can use
a ferrodist master (or the ``ferrodist-store`` server), and a ferrodist client can use torch's
libuv and legacy servers. It is a real ``torch.distributed.Store``, so torch takes it anywhere
it takes a store.

What is better than torch, at no cost to compatibility:

* ``get`` costs one round trip against a ferrodist server (torch's client needs two);
* every call has a deadline: a dead or hung server raises ``DistNetworkError`` within the store
  timeout instead of hanging in ``recv``;
* a master binds the address it is given when that is an IP literal (torch binds every
  interface), never does reverse DNS, caps what one connection can make it buffer, and counts
  workers without polling.

Access control and metrics (ferrodist's own keywords, after torch's arguments):

* ``auth_token``: a master's server admits only clients that prove they hold this token (by
  an HMAC of a fresh challenge; the token never travels), and a store with a token sends
  nothing to a server that does not prove the same token in turn (one without a token, torch's,
  an impostor). ``None`` takes ``FERRODIST_STORE_TOKEN``, or the file that
  ``FERRODIST_STORE_TOKEN_FILE`` names, when set. Without a token the store works against any
  server that does not ask for one (torch's included). A refused client raises
  ``AuthenticationError`` at once. ``allow_unauthenticated_torch_clients=True`` lets a master's
  server with a token still serve stock torch clients (which cannot present one) from loopback
  only (``ferrodist-store --torch-clients-from`` names other networks).
* ``metrics()`` on the master returns its server's metrics in Prometheus' text format, and
  ``metrics_addr="host:port"`` (or ``FERRODIST_STORE_METRICS_ADDR``) serves them on
  ``GET /metrics``, with ``GET /healthz`` beside it.

A client that calls its store back to back can set ``FERRODIST_STORE_SPIN_US`` (say 100) to
poll for each reply that long before sleeping: on a virtual machine whose vCPUs stay busy that
cuts a round trip from 125-150 µs to 28-40 µs, at the cost of that much CPU per call. It is off
by default, since after idle periods (how most jobs call their store) it made calls slower.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Callable, Optional

import torch.distributed as _tdist

from ferrodist import _native
from ferrodist.stores._kinship import KinChecks, kin
from ferrodist.stores.base import _NativeBackedStore

__all__ = ["TCPStore", "when_serving"]

_serving_actions: list[Callable[[], None]] = []
"""Run once, when this process first hosts a store server (see ``when_serving``)."""
_serving = False

_MAX_PORT = 65535


def _torch_describes_tcp_stores() -> bool:
    """True when the installed torch's ``TCPStore`` has a ``repr`` of its own (2.13's does)."""
    import torch.distributed

    return "__repr__" in vars(torch.distributed.TCPStore)


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"TCPStore(): argument '{name}' must be int, not {type(value).__name__}")
    return value


def _check_optional_str(name: str, value: object) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise TypeError(
            f"TCPStore(): argument '{name}' must be str or None, not {type(value).__name__}"
        )
    return value


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"TCPStore(): argument '{name}' must be bool, not {type(value).__name__}")
    return value


def when_serving(action: Callable[[], None]) -> None:
    """Runs ``action`` once, when a ``TCPStore`` of this process first hosts a server (at once if
    one already has): what a higher layer must arrange only once a server exists here, such as
    ``ferrodist.rdzv.api.share_ports_with_torch``, without this layer importing it."""
    if _serving:
        action()
    else:
        _serving_actions.append(action)


def _now_serving() -> None:
    global _serving
    if not _serving:
        _serving = True
        for action in _serving_actions:
            action()
        _serving_actions.clear()


class TCPStore(_NativeBackedStore, metaclass=KinChecks):
    """A TCP key-value store shared by every rank, as ``torch.distributed.TCPStore``.

    The master (``is_master=True``) hosts the server inside its own process, on ferrodist's
    runtime; every store, the master's included, is a client of it.

    Args:
        host_name: the server's host. For the master it is also the bind address: an IP
            literal binds only that address (``127.0.0.1`` keeps the store off the network);
            a host name, ``0.0.0.0`` or ``::`` binds every interface, as torch does.
        port: the server's port; ``0`` on the master picks a free one (see ``port``).
        world_size: number of stores in the job, the master's included. ``None`` (or ``-1``)
            skips worker counting.
        is_master: host the server in this process.
        timeout: default timeout of blocking calls (``get``, ``wait``, ...) and of connecting.
        wait_for_workers: with ``world_size``, the master waits until that many stores joined.
        multi_tenant: masters of this process on the same port share one server; they must
            ask for the same server configuration (``auth_token``,
            ``allow_unauthenticated_torch_clients``, ``metrics_addr``, limits).
        master_listen_fd: an already bound socket for the master to listen on.
        use_libuv: kept for torch compatibility; ``False`` refuses queue operations, as
            torch's legacy backend does.
        auth_token: the store's shared secret (see the module doc); ``None`` takes
            ``FERRODIST_STORE_TOKEN`` or ``FERRODIST_STORE_TOKEN_FILE``.
        allow_unauthenticated_torch_clients: a master with a token still serves stock torch
            clients, from loopback only; they read and write every key.
        metrics_addr: ``host:port`` where a master serves ``/metrics`` and ``/healthz``;
            ``None`` takes ``FERRODIST_STORE_METRICS_ADDR``.

    Raises:
        DistNetworkError: the server could not be reached before ``timeout``, or binding failed.
        DistStoreError: the master timed out waiting for ``world_size`` workers.
        AuthenticationError: the server requires a token and this store has none, or another.
        ValueError: ``world_size`` is 0, or a ``multi_tenant`` master asks for another server
            configuration than the one this process already runs on that port (the message
            names what differs, never a token).

    Example::

        >>> master = ferrodist.TCPStore("127.0.0.1", 0, is_master=True)
        >>> worker = ferrodist.TCPStore("127.0.0.1", master.port)
        >>> worker.set("k", "v")
        >>> master.get("k")
        b'v'
    """

    def __init__(
        self,
        host_name: str,
        port: int,
        world_size: Optional[int] = None,
        is_master: bool = False,
        timeout: timedelta = timedelta(seconds=300),
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        master_listen_fd: Optional[int] = None,
        use_libuv: bool = True,
        *,
        auth_token: Optional[str] = None,
        allow_unauthenticated_torch_clients: bool = False,
        metrics_addr: Optional[str] = None,
    ) -> None:
        if not isinstance(host_name, str):
            raise TypeError(
                f"TCPStore(): argument 'host_name' must be str, not {type(host_name).__name__}"
            )
        port = _check_int("port", port)
        if not 0 <= port <= _MAX_PORT:
            raise TypeError(f"TCPStore(): argument 'port' must be in [0, {_MAX_PORT}], got {port}")
        if world_size is not None:
            world_size = _check_int("world_size", world_size)
            if world_size < 0:
                world_size = None
        if master_listen_fd is not None:
            master_listen_fd = _check_int("master_listen_fd", master_listen_fd)
        if not isinstance(timeout, timedelta):
            raise TypeError(
                f"TCPStore(): argument 'timeout' must be timedelta, not {type(timeout).__name__}"
            )
        handle = _native.tcp_store(
            host_name,
            port,
            world_size,
            _check_bool("is_master", is_master),
            timeout,
            _check_bool("wait_for_workers", wait_for_workers),
            _check_bool("multi_tenant", multi_tenant),
            master_listen_fd,
            _check_bool("use_libuv", use_libuv),
            auth_token=_check_optional_str("auth_token", auth_token),
            allow_unauthenticated_torch_clients=_check_bool(
                "allow_unauthenticated_torch_clients", allow_unauthenticated_torch_clients
            ),
            metrics_addr=_check_optional_str("metrics_addr", metrics_addr),
        )
        self._adopt(handle)
        if is_master:
            _now_serving()

    def _adopt(self, handle: _native.TCPStoreHandle) -> None:
        super().__init__(handle.store())
        self._handle = handle

    def _stop_server(self) -> None:
        """Stops the server this store hosts (a no-op on a client), returning once its port is
        free; every client of it fails from then on."""
        self._handle.stop_server()

    @property
    def host(self) -> str:
        """The server's host name, as given."""
        return self._handle.host

    @property
    def port(self) -> int:
        """The server's port (the one picked when 0 was asked)."""
        return self._handle.port

    @property
    def libuvBackend(self) -> bool:
        """``use_libuv`` as given (ferrodist has one server; the flag only gates queues)."""
        return self._handle.libuv_backend

    def metrics(self) -> str:
        """The server's metrics in Prometheus' text format (what ``GET /metrics`` serves):
        open connections, keys, bytes stored, pending waits, requests by opcode, a request
        latency histogram, rejected frames and refused connections.

        Raises:
            RuntimeError: this store does not host the server (``is_master=False``).
        """
        text = self._handle.metrics()
        if text is None:
            raise RuntimeError(
                "TCPStore.metrics(): this store does not host the server (is_master=False); "
                "scrape the server's metrics_addr, or call it on the master"
            )
        return text

    @property
    def metrics_addr(self) -> Optional[str]:
        """``host:port`` where this master serves ``GET /metrics``, or ``None``."""
        return self._handle.metrics_addr

    def clone(self) -> TCPStore:
        """A new connection to the same server (not a master, no worker counting)."""
        store = TCPStore.__new__(TCPStore)
        store._adopt(self._handle.clone_handle())
        return store

    def __repr__(self) -> str:
        if "_handle" not in vars(self):  # a constructor that raised (tracebacks show its self)
            return "ferrodist.TCPStore(<not connected>)"
        role = "server" if self._handle.is_server else "client"
        own = f"ferrodist.TCPStore(host={self.host!r}, port={self.port}, {role})"
        if not _torch_describes_tcp_stores():
            return own
        # torch's shape first (its tests match it with a regular expression), ours after it.
        return f"{self._handle.torch_repr()} {own}"


kin(TCPStore, _tdist.TCPStore)
