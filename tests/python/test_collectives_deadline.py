"""Collectives over torch's own ``TCPStore`` keep their own timeout, not the store's.

The store's timeout (30 s) is far longer than the collective's (1 s), as in a job whose
rendezvous store waits long for slow nodes. torch's ``_StoreCollectives`` returns within the
collective's timeout (it sets the store's timeout for each call); so must ferrodist's, with the
error class torch's raises, and with every value delivered when the ranks do come.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Callable

import pytest
import torch.distributed as tdist
from _delegating_store import DelegatingStore

import ferrodist
from ferrodist import StoreCollectives

pytestmark = pytest.mark.timeout(120)

STORE_TIMEOUT = timedelta(seconds=30)
TIMEOUT = timedelta(seconds=1)
MARGIN_S = 1.0
TORCH_HAS_STORE_COLLECTIVES = hasattr(tdist, "_StoreCollectives")


@pytest.fixture
def server() -> Iterator[tdist.TCPStore]:
    server = tdist.TCPStore(
        "127.0.0.1", 0, 1, True, timeout=STORE_TIMEOUT, wait_for_workers=False
    )  # fmt: skip
    yield server


def _client(server: tdist.TCPStore) -> tdist.TCPStore:
    return tdist.TCPStore(
        "127.0.0.1", server.port, 1, False, timeout=STORE_TIMEOUT, wait_for_workers=False
    )  # fmt: skip


# Rank 1 of 2, alone: each call waits for rank 0, which never comes.
LONELY: dict[str, Callable[[Any, str], Any]] = {
    "broadcast_recv": lambda c, k: c.broadcast_recv(k, TIMEOUT),
    "scatter_recv": lambda c, k: c.scatter_recv(k, TIMEOUT),
    "gather_recv": lambda c, k: c.gather_recv(k, b"x", TIMEOUT),
    "all_gather": lambda c, k: c.all_gather(k, b"x", TIMEOUT),
    "barrier": lambda c, k: c.barrier(k, TIMEOUT),
}
# What torch's _StoreCollectives raises there (torch-semantics.md 1.4), for a torch without it.
TORCH_RAISES = {
    "broadcast_recv": tdist.DistStoreError,
    "scatter_recv": tdist.DistStoreError,
    "gather_recv": RuntimeError,
    "all_gather": RuntimeError,
    "barrier": RuntimeError,
}


def _timed(call: Callable[[], Any]) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        call()
    return raised.value, time.monotonic() - started


@pytest.mark.parametrize("op", sorted(LONELY))
def test_a_collective_times_out_by_its_own_timeout(server: tdist.TCPStore, op: str) -> None:
    ours, took = _timed(lambda: LONELY[op](StoreCollectives(_client(server), 1, 2), f"o-{op}"))
    assert TIMEOUT.total_seconds() - 0.05 <= took < TIMEOUT.total_seconds() + MARGIN_S, took
    assert isinstance(ours, ferrodist.StoreTimeoutError)
    if TORCH_HAS_STORE_COLLECTIVES:
        theirs_c = tdist._StoreCollectives(_client(server), 1, 2)
        theirs, torch_took = _timed(lambda: LONELY[op](theirs_c, f"t-{op}"))
        assert torch_took < TIMEOUT.total_seconds() + MARGIN_S
        assert isinstance(ours, type(theirs)), (ours, theirs)
        # The store's own words after that differ by torch release ("wait timeout after
        # 1000ms" on 2.13, "Socket Timeout" and a C++ trace on 2.4).
        if op.endswith("_recv") and op != "gather_recv":
            assert "timeout" in str(ours).lower() and "timeout" in str(theirs).lower()
        else:  # the same missing ranks, in torch's words
            assert str(ours).split(", ")[0] == str(theirs).split(", ")[0]
            assert str(ours).startswith(f"{op.removesuffix('_recv')} failed -- missing ranks: 0")
    else:
        assert isinstance(ours, TORCH_RAISES[op])


class CountingStore(DelegatingStore):
    """A torch store over torch's ``TCPStore`` client that counts the waits it is asked for."""

    def __init__(self, inner: tdist.TCPStore) -> None:
        super().__init__(inner)
        self.waits: list[timedelta | None] = []

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self.waits.append(timeout)
        super().wait(keys, timeout)


@pytest.mark.parametrize("op", sorted(LONELY))
def test_a_collective_waits_once_for_its_whole_timeout(server: tdist.TCPStore, op: str) -> None:
    # Not in 100 ms slices: torch's TCPStore client logs two warnings per timed-out wait.
    store = CountingStore(_client(server))
    with pytest.raises(ferrodist.StoreTimeoutError):
        LONELY[op](StoreCollectives(store, 1, 2), op)
    assert len(store.waits) == 1, store.waits
    assert store.waits[0] is not None
    assert TIMEOUT - timedelta(milliseconds=50) <= store.waits[0] <= TIMEOUT


def test_every_value_arrives_when_the_ranks_come_late(server: tdist.TCPStore) -> None:
    world, late_s = 3, 0.3
    results: dict[int, dict[str, Any]] = {}
    errors: list[BaseException] = []
    long = timedelta(seconds=20)

    def rank_main(rank: int) -> None:
        c = StoreCollectives(_client(server), rank, world)
        out: dict[str, Any] = {}
        try:
            # Rank 0 sends and joins late each time, so the others' waits block first.
            if rank == 0:
                time.sleep(late_s)
                c.broadcast_send("b", b"from 0", long)
                time.sleep(late_s)
                out["scatter"] = c.scatter_send("s", [b"s0", b"s1", b"s2"], long)
                time.sleep(late_s)
                c.gather_send("g", b"g0", long)
                time.sleep(late_s)
            else:
                out["broadcast"] = c.broadcast_recv("b", long)
                out["scatter"] = c.scatter_recv("s", long)
                if rank == 1:
                    out["gather"] = c.gather_recv("g", b"g1", long)
                else:
                    c.gather_send("g", b"g2", long)
            out["all_gather"] = c.all_gather("ag", f"a{rank}".encode(), long)
            c.barrier("end", long)
            out["sum"] = c.all_sum("sum", 10**rank, long)
        except BaseException as err:  # reported below
            errors.append(err)
        results[rank] = out

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    everyone = [b"a0", b"a1", b"a2"]
    assert results[0] == {"scatter": b"s0", "all_gather": everyone, "sum": 111}
    assert results[1] == {
        "broadcast": b"from 0",
        "scatter": b"s1",
        "gather": [b"g0", b"g1", b"g2"],
        "all_gather": everyone,
        "sum": 111,
    }
    assert results[2] == {
        "broadcast": b"from 0",
        "scatter": b"s2",
        "all_gather": everyone,
        "sum": 111,
    }


class NoWaitStore(tdist.Store):
    """A user's store with get and set only: torch's base class has no wait for it."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = tdist.HashStore()

    def set(self, key: str, value: Any) -> None:
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)


def test_a_store_without_wait_still_receives() -> None:
    store = NoWaitStore()
    threading.Timer(0.2, lambda: store.set("b", b"late")).start()
    assert StoreCollectives(store, 1, 2).broadcast_recv("b", timedelta(seconds=10)) == b"late"
