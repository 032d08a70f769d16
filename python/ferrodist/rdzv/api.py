"""``ferrodist.rendezvous``: torch's ``torch.distributed.rendezvous`` contract, ferrodist's stores.

``rendezvous(url, rank=-1, world_size=-1, **kwargs)`` returns a generator that yields ``(store,
rank, world_size)`` once and raises ``RuntimeError`` if asked to rendezvous again, as torch's does.
``tcp://`` and ``env://`` give a ferrodist ``TCPStore`` (rank 0 hosts the server, shared by every
multi-tenant master of the process on that port), ``file://`` a ferrodist ``FileStore``,
``etcd://host:port[,host:port]/JOB`` a ferrodist ``EtcdStore`` (a scheme also registered in torch's
dispatcher, see ``register_etcd_with_torch``); any other scheme goes to torch's dispatcher and the
handlers registered there with ``register_rendezvous_handler``. Argument errors are torch's:
``RuntimeError`` for a URL, rank or world size of the wrong type, ``ValueError`` ("Error
initializing torch.distributed using ...") for a URL or environment that lacks what the scheme
needs.

Port sharing with torch: torch shares one multi-tenant store server per port between the process
group and torch RPC, through a process-wide table ferrodist's servers are not in. So that RPC's
``tcp://`` or ``env://`` init in rank 0 can use the port ferrodist's rendezvous already serves,
``share_ports_with_torch`` (run once, when this process's first ferrodist server starts) wraps
torch's two handlers: for a port a ferrodist server of this process serves, they hand out
ferrodist's store; for any other port they are torch's handlers, untouched.
"""

from __future__ import annotations

import importlib
import numbers
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Callable, Union
from urllib.parse import urlparse, urlunparse

import torch.distributed as _tdist

from ferrodist import _native
from ferrodist._redact import redact_url
from ferrodist.rdzv.etcd_url import etcd_store_from_url
from ferrodist.rdzv.join import use_libuv_from
from ferrodist.stores.file import FileStore
from ferrodist.stores.tcp import TCPStore

__all__ = ["register_etcd_with_torch", "rendezvous", "share_ports_with_torch"]

_Yield = Iterator[tuple[_tdist.Store, int, int]]
_OUR_SCHEMES = ("tcp", "env", "file", "etcd")


def _torch_rendezvous_module() -> Any:
    return importlib.import_module("torch.distributed.rendezvous")


def _query(url: str) -> dict[str, str]:
    """The URL's query as torch reads it: ``a=1&b=2``, the last value of a repeated name wins."""
    pairs = (item.split("=", 1) for item in urlparse(url).query.split("&") if item)
    return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}


def _error(scheme: str, message: str) -> ValueError:
    return ValueError(
        f"Error initializing torch.distributed using {scheme}:// rendezvous: {message}"
    )


def _with_node_arguments(url: str, rank: int, world_size: int) -> str:
    """The URL with ``rank`` and ``world_size`` in its query where given, as torch's dispatcher
    puts them (for ``env://``, ``RANK`` and ``WORLD_SIZE`` from the environment stand in for
    -1); a URL that already names either may not be given them again."""
    parsed = urlparse(url)
    if parsed.scheme == "env":
        rank = int(os.environ.get("RANK", rank))
        world_size = int(os.environ.get("WORLD_SIZE", world_size))
    if rank == -1 and world_size == -1:
        return url
    query = _query(url)
    if "rank" in query or "world_size" in query:
        raise AssertionError(
            f"The url: {redact_url(url)} has node-specific arguments(rank, world_size) already."
        )
    if rank != -1:
        query["rank"] = str(rank)
    if world_size != -1:
        query["world_size"] = str(world_size)
    return urlunparse(parsed._replace(query="&".join(f"{k}={v}" for k, v in query.items())))


def _uses_agent_store() -> bool:
    """torch's test: torchelastic's agent hosts the store, every rank is a client."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)


def _tcp_store(
    host: str, port: int, rank: int, world_size: int, timeout: timedelta, use_libuv: bool
) -> _tdist.Store:

    if not 0 <= port < 2**16:
        raise ValueError(f"port must have value from 0 to 65535 but was {port}.")
    if _uses_agent_store():
        return TCPStore(host, port, world_size, False, timeout)
    return TCPStore(
        host, port, world_size, rank == 0, timeout, multi_tenant=True, use_libuv=use_libuv
    )


def _rank_and_world_size(scheme: str, query: dict[str, str]) -> tuple[int, int]:
    """``rank`` and ``world_size`` from a URL's query, with torch's errors when either is absent."""
    if "rank" not in query:
        raise _error(scheme, "rank parameter missing")
    if "world_size" not in query:
        raise _error(scheme, "world size parameter missing")
    return int(query["rank"]), int(query["world_size"])


def _tcp_handler(url: str, timeout: timedelta = _tdist.default_pg_timeout, **_: Any) -> _Yield:
    parsed = urlparse(url)
    if parsed.port is None:
        raise _error("tcp", "port number missing")
    query = _query(url)
    rank, world_size = _rank_and_world_size("tcp", query)
    if parsed.hostname is None:
        raise AssertionError("hostname cannot be None")
    libuv = use_libuv_from({k: [v] for k, v in query.items()})
    yield (
        _tcp_store(parsed.hostname, parsed.port, rank, world_size, timeout, libuv),
        rank,
        world_size,
    )
    raise RuntimeError("Unable to perform re-rendezvous using tcp:// method")


def _env_value(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise _error("env", f"environment variable {name} expected, but not set")
    return value


def _env_handler(url: str, timeout: timedelta = _tdist.default_pg_timeout, **_: Any) -> _Yield:
    query = _query(url)
    rank = int(query["rank"]) if "rank" in query else int(_env_value("RANK"))
    world_size = (
        int(query["world_size"]) if "world_size" in query else int(_env_value("WORLD_SIZE"))
    )
    host, port = _env_value("MASTER_ADDR"), int(_env_value("MASTER_PORT"))
    libuv = use_libuv_from({k: [v] for k, v in query.items()})
    store = _tcp_store(host, port, rank, world_size, timeout, libuv)
    yield store, rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


def _file_handler(url: str, **_: Any) -> _Yield:

    parsed = urlparse(url)
    path = parsed.path or parsed.netloc
    if not path:
        raise _error("file", "path missing")
    rank, world_size = _rank_and_world_size("file", _query(url))
    yield FileStore(path, world_size), rank, world_size
    raise RuntimeError("Unable to perform rerendezvous using file:// method")


def _etcd_handler(url: str, timeout: timedelta = _tdist.default_pg_timeout, **_: Any) -> _Yield:

    rank, world_size = _rank_and_world_size("etcd", _query(url))
    yield etcd_store_from_url(url, timeout), rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using etcd:// method")


_HANDLERS: dict[str, Callable[..., _Yield]] = {
    "tcp": _tcp_handler,
    "env": _env_handler,
    "file": _file_handler,
    "etcd": _etcd_handler,
}


def rendezvous(
    url: Union[str, bytes], rank: int = -1, world_size: int = -1, **kwargs: Any
) -> _Yield:
    """torch's ``rendezvous``: a generator that yields ``(store, rank, world_size)`` once.

    Args:
        url: ``tcp://host:port``, ``env://``, ``file:///path`` (ferrodist's stores), or a scheme
            registered with ``register_rendezvous_handler``.
        rank: this process's rank (-1: from the URL or, for ``env://``, ``RANK``).
        world_size: number of ranks (-1: from the URL or, for ``env://``, ``WORLD_SIZE``).
        **kwargs: passed to the handler (``timeout=timedelta(...)``).

    Raises:
        RuntimeError: ``url`` is not a string, ``rank`` or ``world_size`` not an integer, no
            handler for the scheme, or the generator is asked for a second rendezvous.
        ValueError: the URL or environment lacks what the scheme needs.
    """
    if not isinstance(url, (str, bytes)):
        raise RuntimeError(f"`url` must be a string. {type(url)}: {redact_url(repr(url))}")
    if not isinstance(rank, numbers.Integral):
        raise RuntimeError(f"`rank` must be an integer. {rank}")
    if not isinstance(world_size, numbers.Integral):
        raise RuntimeError(f"`world_size` must be an integer. {world_size}")
    text = url.decode() if isinstance(url, bytes) else url
    scheme = urlparse(text).scheme
    if scheme not in _OUR_SCHEMES:
        handed: _Yield = _torch_rendezvous_module().rendezvous(text, rank, world_size, **kwargs)
        return handed
    return _HANDLERS[scheme](_with_node_arguments(text, int(rank), int(world_size)), **kwargs)


def _served_port(scheme: str, url: str) -> Union[int, None]:
    """The port a ``tcp://`` or ``env://`` URL names, if a ferrodist server of this process
    serves it (anything unreadable is left to torch's handler and its own errors)."""
    try:
        port = urlparse(url).port if scheme == "tcp" else int(os.environ.get("MASTER_PORT", ""))
    except ValueError:
        return None
    return port if port is not None and _native.serves_port(port) else None


def _sharing(scheme: str, torch_handler: Callable[..., _Yield]) -> Callable[..., _Yield]:
    def handler(url: str, **kwargs: Any) -> _Yield:
        if _served_port(scheme, url) is not None and not _uses_agent_store():
            return _HANDLERS[scheme](url, **kwargs)
        return torch_handler(url, **kwargs)

    handler.__doc__ = f"torch's {scheme}:// handler, but on a port ferrodist serves here."
    handler._ferrodist_shares_ports = True  # type: ignore[attr-defined]
    return handler


def register_etcd_with_torch() -> None:
    """Registers ``etcd://`` in torch's rendezvous dispatcher (once), through torch's public
    ``register_rendezvous_handler``, so that torch's own ``init_process_group(init_method=
    "etcd://...")`` and ``torch.distributed.rendezvous`` take it too. A handler someone else
    registered for the scheme is left in place."""
    torch_rendezvous = _torch_rendezvous_module()
    if "etcd" not in torch_rendezvous._rendezvous_handlers:
        torch_rendezvous.register_rendezvous_handler("etcd", _etcd_handler)


def share_ports_with_torch() -> None:
    """Wraps torch's ``tcp://`` and ``env://`` rendezvous handlers (once) so that on a port a
    ferrodist server of this process serves, torch's rendezvous (torch RPC's init) shares it.

    Run by ``ferrodist.stores.tcp.when_serving`` as this process's first server starts: until
    then no port is ferrodist's, and torch's handlers stay as they are."""
    registry = _torch_rendezvous_module()._rendezvous_handlers
    for scheme in ("tcp", "env"):
        torch_handler = registry.get(scheme)
        if torch_handler is None or getattr(torch_handler, "_ferrodist_shares_ports", False):
            continue
        registry[scheme] = _sharing(scheme, torch_handler)
