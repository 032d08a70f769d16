"""A durable server keeps its waiters (issue 27 item 8), through Python's ``TCPStore``.

Python waits in short slices (to notice Ctrl-C), so a wait blocked when an etcd-backed
``ferrodist-store`` is SIGKILLed is carried across slices, not within one call as in Rust
(tests/durable_waiters.rs): it returns the key once the server is back on its port, or raises
its timeout at its deadline when the server never returns. Against an in-memory server a lost
connection still fails the wait at once.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Callable

import pytest
import torch.distributed as tdist
from etcd_support import EtcdCluster
from tcp_support import StoreServer

import ferrodist
from ferrodist.errors import ConnectionClosedError, StoreTimeoutError

pytestmark = pytest.mark.timeout(120)

NOTICE_S = 1.5  # how long after an event a waiter may take to see it (two shared cores)
# A client knocks on a dead durable server at most every 2 s, jittered by up to 1.5x
# (conn_pool.rs's RECONNECT_MAX): the longest it may take to find the restarted one.
LONGEST_RECONNECT_PAUSE_S = 3.0


def _durable(cluster: EtcdCluster, prefix: str, port: int) -> StoreServer:
    return StoreServer("--port", str(port), "--backend", f"etcd://{cluster.endpoints}/{prefix}")


def _ours(port: int) -> ferrodist.TCPStore:
    return ferrodist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))


class _Blocked(threading.Thread):
    """A store call in a thread of its own, blocked by the time the constructor returns."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._call = call
        self.result: Any = None
        self.error: BaseException | None = None
        self.ended = 0.0
        self.start()
        time.sleep(0.5)

    def run(self) -> None:
        try:
            self.result = self._call()
        except BaseException as err:  # handed to the test, which asserts on it
            self.error = err
        self.ended = time.monotonic()


def test_a_blocked_wait_and_get_return_after_a_durable_servers_restart(
    etcd_cluster: EtcdCluster, etcd_prefix: str, free_port: int
) -> None:
    first = _durable(etcd_cluster, etcd_prefix, free_port)
    servers = [first]
    try:
        store = _ours(free_port)
        assert not store.check(["warm"])
        waiter = _Blocked(lambda: store.wait(["a", "b"], timedelta(seconds=20)))
        getter = _Blocked(lambda: store.get("b"))
        first.proc.kill()  # SIGKILL
        first.proc.communicate(timeout=10)
        time.sleep(1.0)
        assert waiter.is_alive() and getter.is_alive(), (waiter.error, getter.error)
        servers.append(_durable(etcd_cluster, etcd_prefix, free_port))
        back_at = time.monotonic()
        stock = tdist.TCPStore(
            "127.0.0.1", free_port, is_master=False, timeout=timedelta(seconds=30)
        )
        stock.set("a", "1")
        stock.set("b", "2")
        waiter.join(30)
        getter.join(30)
        assert waiter.error is None and getter.error is None, (waiter.error, getter.error)
        assert getter.result == b"2"
        assert waiter.ended - back_at < LONGEST_RECONNECT_PAUSE_S + NOTICE_S
    finally:
        for server in servers:
            server.stop()


def test_a_wait_whose_durable_server_never_returns_raises_at_its_deadline(
    etcd_cluster: EtcdCluster, etcd_prefix: str, free_port: int
) -> None:
    server = _durable(etcd_cluster, etcd_prefix, free_port)
    try:
        store = _ours(free_port)
        started = time.monotonic()
        waiter = _Blocked(lambda: store.wait(["never"], timedelta(seconds=3)))
        server.proc.kill()
        waiter.join(30)
        took = waiter.ended - started
        assert 3.0 <= took < 3.0 + NOTICE_S, took
        assert isinstance(waiter.error, StoreTimeoutError), repr(waiter.error)
        assert isinstance(waiter.error, tdist.DistStoreError)
        message = str(waiter.error)
        assert message.startswith("wait timeout after 3000ms, keys: /never"), message
        assert f"127.0.0.1:{free_port}" in message, message
    finally:
        server.stop()


def test_a_wait_on_an_in_memory_server_fails_at_once_when_it_dies() -> None:
    server = StoreServer()
    try:
        store = _ours(server.port)
        waiter = _Blocked(lambda: store.wait(["k"], timedelta(seconds=20)))
        killed = time.monotonic()
        server.proc.kill()
        waiter.join(30)
        assert waiter.ended - killed < NOTICE_S
        assert isinstance(waiter.error, ConnectionClosedError), repr(waiter.error)
    finally:
        server.stop()
