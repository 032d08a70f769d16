"""``ferrodist-store --backend etcd://...``: the standalone server with its state in a real
3-member etcd cluster. Stock ``torch.distributed.TCPStore`` clients use it unchanged; a server
killed with SIGKILL and started again on its port still has every key a client was answered
about, and ferrodist's client reconnects to it within its timeout."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as tdist
from etcd_support import EtcdCluster
from tcp_support import StoreServer

import ferrodist

pytestmark = pytest.mark.timeout(120)


def _backend(cluster: EtcdCluster, prefix: str) -> str:
    return f"etcd://{cluster.endpoints}/{prefix}"


def _stock(port: int) -> tdist.TCPStore:
    return tdist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30), wait_for_workers=False
    )


def test_a_stock_torch_client_is_served_from_etcd(
    etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    server = StoreServer("--backend", _backend(etcd_cluster, etcd_prefix))
    try:
        client, other = _stock(server.port), _stock(server.port)
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert client.add("n", 5) == 5
        assert other.add("n", -2) == 3
        assert client.compare_set("k", "v", "w") == b"w"
        assert client.compare_set("k", "nope", "x") == b"w"
        assert client.compare_set("missing", "x", "y") == b"x"
        assert client.compare_set("created", "", "y") == b"y"
        assert client.check(["k", "n"]) and not client.check(["k", "missing"])
        assert client.delete_key("created") and not client.delete_key("created")
        assert client.num_keys() == 2
        client.append("log", "a")  # type: ignore[attr-defined]
        client.append("log", b"b")  # type: ignore[attr-defined]
        client.multi_set(["m1", "m2"], ["1", b"2"])  # type: ignore[attr-defined]
        assert client.multi_get(["m1", "m2", "log"]) == [b"1", b"2", b"ab"]

        # A wait is released by another client's set (a watch in the server, not polling).
        threading.Timer(0.3, lambda: other.set("late", "1")).start()
        started = time.monotonic()
        client.wait(["late"])
        assert time.monotonic() - started >= 0.25
        with pytest.raises(tdist.DistStoreError):
            client.wait(["never"], timedelta(milliseconds=300))

        # The keys are in etcd under their wire names (torch's client adds the leading `/`).
        direct = ferrodist.EtcdStore(etcd_cluster.endpoints, etcd_prefix, timedelta(seconds=10))
        assert direct.get("/k") == b"w"
        assert direct.get("/n") == b"3"
    finally:
        server.stop()


def test_a_killed_server_restarted_on_its_port_serves_every_acknowledged_key(
    etcd_cluster: EtcdCluster, etcd_prefix: str, free_port: int
) -> None:
    backend = ("--port", str(free_port), "--backend", _backend(etcd_cluster, etcd_prefix))
    first = StoreServer(*backend)
    writer = _stock(free_port)
    writer.set("k", "v")
    assert writer.add("n", 1) == 1  # the reply acknowledges the set before it, too
    ours = ferrodist.TCPStore(
        "127.0.0.1", free_port, is_master=False, timeout=timedelta(seconds=30)
    )
    assert ours.get("k") == b"v"
    first.proc.kill()  # SIGKILL
    first.proc.communicate(timeout=10)

    # Started again a second later: ferrodist's client, called while nothing listens, waits
    # for it (its server said its state outlives it) instead of failing.
    servers: list[StoreServer] = []
    restart = threading.Timer(1.0, lambda: servers.append(StoreServer(*backend)))
    restart.start()
    try:
        started = time.monotonic()
        assert ours.get("k") == b"v"
        assert time.monotonic() - started >= 0.9
        assert ours.add("n", 1) == 2
        restart.join()
        # A new stock client, and a second server on another port, see the same state.
        assert _stock(free_port).get("n") == b"2"
        beside = StoreServer("--backend", _backend(etcd_cluster, etcd_prefix))
        servers.append(beside)
        assert _stock(beside.port).get("k") == b"v"
    finally:
        restart.join()
        for server in servers:
            server.stop()


def test_world_size_is_counted_from_etcd(etcd_cluster: EtcdCluster, etcd_prefix: str) -> None:
    server = StoreServer("--world-size", "2", "--backend", _backend(etcd_cluster, etcd_prefix))
    try:
        for _ in range(2):  # each stock client adds 1 to the worker counter, `init/`
            tdist.TCPStore("127.0.0.1", server.port, world_size=2, timeout=timedelta(seconds=30))
        time.sleep(0.5)
        server.proc.terminate()
        _, err = server.proc.communicate(timeout=20)
        assert "all clients joined" in err
    finally:
        server.stop()
