"""A key repeated in one ``multi_set`` keeps its last value on etcd, as on torch's own stores.

etcd refuses a key twice in one transaction; torch's HashStore and TCPStore apply the pairs in
order. The reference is torch itself: what its two stores hold after the same call.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as tdist
from etcd_support import EtcdCluster
from tcp_support import StoreServer

import ferrodist

pytestmark = pytest.mark.timeout(120)

Pairs = tuple[list[str], list[bytes]]

# 150 distinct keys (more than one etcd transaction of 128 puts), most given twice.
_MANY = [f"k{i}" for i in range(150)] + [f"k{i}" for i in range(0, 150, 2)] + ["k1"]
CASES: dict[str, Pairs] = {
    "twice": (["k", "j", "k"], [b"1", b"2", b"3"]),
    "only-repeats": (["k", "k", "k"], [b"a", b"b", b""]),
    "across-batches": (_MANY, [f"{k}@{n}".encode() for n, k in enumerate(_MANY)]),
}


def _after(store: tdist.Store, pairs: Pairs) -> dict[str, bytes]:
    keys, values = pairs
    store.multi_set(keys, values)  # type: ignore[attr-defined]
    return {k: store.get(k) for k in sorted(set(keys))}


def _torchs(pairs: Pairs) -> dict[str, bytes]:
    """What torch's HashStore and TCPStore hold after the call (they agree)."""
    server = tdist.TCPStore(
        "127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    hashed, tcp = _after(tdist.HashStore(), pairs), _after(server, pairs)
    assert hashed == tcp
    return hashed


@pytest.fixture
def server(etcd_cluster: EtcdCluster, etcd_prefix: str) -> Iterator[StoreServer]:
    server = StoreServer("--backend", f"etcd://{etcd_cluster.endpoints}/{etcd_prefix}")
    yield server
    server.stop()


@pytest.mark.parametrize("case", sorted(CASES))
def test_etcd_store_keeps_the_last_value_like_torch(
    etcd_cluster: EtcdCluster, etcd_prefix: str, case: str
) -> None:
    store = ferrodist.EtcdStore(etcd_cluster.endpoints, etcd_prefix, timedelta(seconds=10))
    assert _after(store, CASES[case]) == _torchs(CASES[case])


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_etcd_backed_server_keeps_the_last_value_like_torch(
    server: StoreServer, case: str
) -> None:
    stock = tdist.TCPStore(
        "127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30),
        wait_for_workers=False,
    )  # fmt: skip
    ours = ferrodist.TCPStore(
        "127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30),
        wait_for_workers=False,
    )  # fmt: skip
    expected = _torchs(CASES[case])
    # Apart, so that each client's call has to land by itself.
    assert _after(tdist.PrefixStore("stock", stock), CASES[case]) == expected
    assert _after(tdist.PrefixStore("ours", ours), CASES[case]) == expected
