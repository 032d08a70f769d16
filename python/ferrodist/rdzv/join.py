"""Rendezvous: turn an ``init_method`` URL into a store every rank shares, and wait for all ranks.

Two entry points. ``join`` is what ``ferrodist.init_process_group`` runs: open the store and wait
for every rank, with progress reports and a timeout that names the missing ranks. ``rendezvous``
is torch's public ``torch.distributed.rendezvous`` contract (a generator that yields
``(store, rank, world_size)`` once and refuses a re-rendezvous), built on ferrodist's stores; it
lives in ``ferrodist.rdzv.api``.

``tcp://host:port`` and ``env://`` host the TCP store server inside rank 0 (the embedded default: no
separate process to start); ``file:///path`` shares a file; ``etcd://host:port,.../JOB`` keeps the
store in an etcd cluster (``ferrodist.rdzv.etcd_url``), which outlives any rank. Unlike torch, the
wait for the other ranks is observable: every rank registers under ``_RDZV_PREFIX`` as it arrives; a
waiting rank logs which ranks have joined and which are still missing every ``progress_interval``
seconds (env ``FERRODIST_RENDEZVOUS_PROGRESS_S``, default 10; logger ``ferrodist.rendezvous`` at
WARNING, so it shows with no logging set-up: a rank still waiting after that long is worth a look);
a timeout raises ``StoreTimeoutError`` naming the ranks that never came, not torch's bare count of
workers.

The join runs in the Rust core (``rust/rendezvous.rs``) and is event-driven, not polled: each rank
enrolls itself in a roll that counts the ranks so far (on TCP, hash and file stores an append to a
``joined`` list and an add to a counter; on etcd a key per rank counted in the same transaction,
since a shared key there is a compare-and-swap every rank contends for), the rank that completes
the count sets a ``done`` key, and everyone else blocks on that key in slices of the progress
interval. A prompt rendezvous costs two or three store round trips; each progress report one
more.
"""

from __future__ import annotations

import importlib
import logging
import os
from datetime import timedelta
from typing import Any, Optional
from urllib.parse import parse_qs, urlparse

import torch.distributed as _tdist

from ferrodist import _native
from ferrodist.collectives import _native_handle
from ferrodist.rdzv.etcd_url import etcd_store_from_url
from ferrodist.stores.file import FileStore
from ferrodist.stores.tcp import TCPStore

__all__ = ["join", "wait_for_ranks"]

logger = logging.getLogger("ferrodist.rendezvous")

PROGRESS_ENV = "FERRODIST_RENDEZVOUS_PROGRESS_S"
"""Environment variable: seconds between progress reports while a rendezvous waits."""

DEFAULT_PROGRESS_S = 10.0
"""Default report interval: rare enough to stay quiet in a prompt start, often enough that a
stuck job says which ranks it waits for well before torch's 30-minute default timeout."""

_RDZV_PREFIX = "ferrodist/rendezvous/"


def _key_prefix() -> str:
    """Join keys for this attempt. Under torchelastic the agent's store outlives a restart, so
    each restart gets its own keys (a stale count from the last attempt would let ranks through).
    """
    return f"{_RDZV_PREFIX}{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


def _store_class(kind: str) -> Any:
    """The store class for ``kind`` ("tcp" or "file"): ferrodist's, which take torch's arguments."""
    return {"tcp": TCPStore, "file": FileStore}[kind]


def use_libuv_from(query: dict[str, list[str]]) -> bool:
    """torch's rule: ``?use_libuv=`` in the URL, else env ``USE_LIBUV``, else on; ``"1"`` is on."""
    if "use_libuv" in query:
        return query["use_libuv"][0] == "1"
    return os.environ.get("USE_LIBUV", "1") == "1"


def _query_int(query: dict[str, list[str]], key: str, given: int, url: str) -> int:
    if given != -1:
        return given
    if key not in query:
        scheme = url.split("://", 1)[0]
        raise ValueError(
            f"Error initializing torch.distributed using {scheme}:// rendezvous: "
            f"{key} parameter missing"
        )
    return int(query[key][0])


def _env(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise ValueError(
            "Error initializing torch.distributed using env:// rendezvous: environment variable "
            f"{name} expected, but not set"
        )
    return value


def _registered_handler(
    url: str, scheme: str, rank: int, world_size: int, timeout: timedelta
) -> tuple[_tdist.Store, int, int]:
    """A scheme of the user's own, through the handler registered with torch's
    ``register_rendezvous_handler`` (ferrodist re-exports it)."""
    torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")
    if scheme not in torch_rendezvous._rendezvous_handlers:
        raise ValueError(
            f"No rendezvous handler for {scheme}://; use env://, tcp:// or file://, or register "
            "one with register_rendezvous_handler"
        )
    # torch's own dispatcher: it puts rank and world_size into the URL as handlers expect.
    handed = torch_rendezvous.rendezvous(url, rank, world_size, timeout=timeout)
    store, rank, world_size = next(handed)
    return store, rank, world_size


def _open_store(
    url: str, rank: int, world_size: int, timeout: timedelta
) -> tuple[_tdist.Store, int, int]:
    """Parse ``url``, resolve rank and world size, and open (or host) the store."""
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    if parsed.scheme == "env":
        rank = rank if rank != -1 else int(_env("RANK"))
        world_size = world_size if world_size != -1 else int(_env("WORLD_SIZE"))
        host, port = _env("MASTER_ADDR"), int(_env("MASTER_PORT"))
        # Under torchelastic the agent already hosts the store; every rank is a client.
        hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    elif parsed.scheme == "tcp":
        rank = _query_int(query, "rank", rank, url)
        world_size = _query_int(query, "world_size", world_size, url)
        if parsed.hostname is None or parsed.port is None:
            raise ValueError(f"tcp:// init_method needs a host and a port, got {url!r}")
        host, port, hosts = parsed.hostname, parsed.port, rank == 0
    elif parsed.scheme == "etcd":
        rank = _query_int(query, "rank", rank, url)
        world_size = _query_int(query, "world_size", world_size, url)
        _check_rank(rank, world_size)
        return etcd_store_from_url(url, timeout), rank, world_size
    elif parsed.scheme == "file":
        rank = _query_int(query, "rank", rank, url)
        world_size = _query_int(query, "world_size", world_size, url)
        path = parsed.path or parsed.netloc
        if not path:
            raise ValueError(f"file:// init_method needs a path, got {url!r}")
        _check_rank(rank, world_size)
        return _store_class("file")(path, world_size), rank, world_size
    else:
        return _registered_handler(url, parsed.scheme, rank, world_size, timeout)
    _check_rank(rank, world_size)
    try:
        # multi_tenant, as torch's rendezvous: torch RPC's tcp:// or env:// init on the same port
        # in rank 0 shares this server (see ferrodist.rdzv.api.share_ports_with_torch).
        store = _store_class("tcp")(
            host,
            port,
            world_size,
            hosts,
            timeout,
            wait_for_workers=False,
            multi_tenant=True,
            use_libuv=use_libuv_from(query),
        )
    except _tdist.DistError as e:
        if hosts:
            raise
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            raise
        raise _renamed(
            e,
            f"rendezvous: rank {rank} could not reach the store that rank 0 hosts at "
            f"{host}:{port} within {timeout}; missing ranks: [0] (rank 0 never started "
            f"its server). Cause: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
        ) from e
    return store, rank, world_size


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is out of range for world_size {world_size}")


def _renamed(error: BaseException, message: str) -> BaseException:
    """The same exception class with a clearer message (so the same ``except`` catches it)."""
    try:
        return type(error)(message)
    except Exception:
        return error


def _progress_interval(given: Optional[float]) -> float:
    if given is not None:
        return float(given)
    raw = os.environ.get(PROGRESS_ENV)
    try:
        return float(raw) if raw else DEFAULT_PROGRESS_S
    except ValueError:
        raise ValueError(f"{PROGRESS_ENV} must be a number of seconds, got {raw!r}") from None


def wait_for_ranks(
    store: _tdist.Store,
    rank: int,
    world_size: int,
    timeout: timedelta,
    progress_interval: Optional[float] = None,
) -> None:
    """Register ``rank`` and block until all ``world_size`` ranks have, reporting progress.

    The join runs in the Rust core (``rust/rendezvous.rs``): two or three requests per rank, and
    one read per progress report whatever the world size.

    Raises:
        StoreTimeoutError: ``timeout`` passed first; the message lists the missing ranks.
    """
    interval = _progress_interval(progress_interval)
    handle = _native_handle(store)
    join = _native.RendezvousJoin(handle, _key_prefix(), rank, world_size, timeout)
    if join.complete:
        return
    while True:
        report = join.wait(interval)
        if report is None:
            return
        waited, who = report
        logger.warning("rank %d waiting in rendezvous for %.1fs: %s", rank, waited, who)


def join(
    url: str,
    rank: int = -1,
    world_size: int = -1,
    timeout: timedelta = _tdist.constants.default_pg_timeout,
    progress_interval: Optional[float] = None,
) -> tuple[_tdist.Store, int, int]:
    """Open the store named by ``url`` and wait until every rank has joined.

    Args:
        url: ``env://``, ``tcp://host:port[?rank=R&world_size=N]``,
            ``file:///path[?rank=R&world_size=N]``, or a scheme registered with
            ``register_rendezvous_handler`` (run by torch's dispatcher).
        rank: this process's rank (-1: from the URL or the environment).
        world_size: number of ranks (-1: from the URL or the environment).
        timeout: how long to wait for the store and the other ranks.
        progress_interval: seconds between progress log lines (default: env
            ``FERRODIST_RENDEZVOUS_PROGRESS_S``, else 10).

    Returns:
        ``(store, rank, world_size)``, as torch's ``rendezvous`` yields them.
    """
    store, rank, world_size = _open_store(url, rank, world_size, timeout)
    store.set_timeout(timeout)
    wait_for_ranks(store, rank, world_size, timeout, progress_interval)
    return store, rank, world_size
