"""EtcdStore through etcd failures, each on a cluster of its own: the leader killed in the middle
of a 64-rank rendezvous, and a member killed and restarted under a stream of writes. Nothing a
call acknowledged may be lost, and nothing may be applied twice."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from etcd_support import etcd_cluster

import ferrodist
from ferrodist.rdzv import join as _rendezvous

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

RANKS = 64


def test_a_64_rank_rendezvous_completes_when_the_leader_dies_in_it() -> None:
    with etcd_cluster(3) as cluster:
        url = f"etcd://{cluster.endpoints}/rdzv64"
        arrived = threading.Barrier(RANKS // 2 + 1)
        results: dict[int, object] = {}

        def rank_main(rank: int) -> None:
            try:
                if rank < RANKS // 2:
                    arrived.wait(timeout=60)  # half the ranks join after the kill
                store, _, _ = _rendezvous.join(
                    url, rank, RANKS, timedelta(seconds=90), progress_interval=30
                )
                # What torch's init does next: every rank publishes, then reads everyone's.
                ticket = store.add("tickets", 1)
                store.set(f"addr/{rank}", f"host-{rank}")
                keys = [f"addr/{r}" for r in range(RANKS)]
                store.wait(keys, timedelta(seconds=90))
                results[rank] = (ticket, store.multi_get(keys))
            except BaseException as exc:  # reported below, per rank
                results[rank] = exc

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(RANKS)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # the late half is joining now
        cluster.kill(cluster.leader())
        arrived.wait(timeout=60)
        for t in threads:
            t.join(timeout=150)
        failures = {r: v for r, v in results.items() if isinstance(v, BaseException)}
        assert not failures, failures
        assert len(results) == RANKS
        tickets = sorted(v[0] for v in results.values())  # type: ignore[index]
        assert tickets == list(range(1, RANKS + 1)), "each add counted exactly once"
        expected = [f"host-{r}".encode() for r in range(RANKS)]
        assert all(v[1] == expected for v in results.values())  # type: ignore[index]
        check = ferrodist.EtcdStore(cluster.endpoints, "rdzv64", timedelta(seconds=20))
        assert check.get("tickets") == str(RANKS).encode()


def test_a_member_killed_and_restarted_loses_nothing_acknowledged() -> None:
    with etcd_cluster(3) as cluster:
        store = ferrodist.EtcdStore(cluster.endpoints, "restart", timedelta(seconds=30))
        acknowledged: list[int] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def write() -> None:
            i = 0
            while not stop.is_set():
                try:
                    store.set(f"k{i}", str(i))
                    store.add("count", 1)
                    store.queue_push("q", str(i))
                    store.append("log", f"{i},")
                except BaseException as exc:
                    errors.append(exc)
                    return
                acknowledged.append(i)
                i += 1

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(0.5)
        victim = cluster.leader()
        cluster.kill(victim)
        time.sleep(1.0)
        cluster.restart(victim)
        cluster.wait_ready([victim])
        time.sleep(0.5)
        # Kill another member: the cluster keeps a quorum only with the restarted one in it,
        # so what follows proves it caught up.
        other = next(i for i in cluster.running() if i != victim)
        cluster.kill(other)
        time.sleep(1.0)
        stop.set()
        writer.join(timeout=60)
        assert not errors, errors
        assert len(acknowledged) > 20, "writes went on through the faults"
        reader = ferrodist.EtcdStore(cluster.endpoints, "restart", timedelta(seconds=30))
        done = len(acknowledged)
        values = reader.multi_get([f"k{i}" for i in range(done)])
        assert values == [str(i).encode() for i in range(done)]
        assert reader.get("count") == str(done).encode(), "no add lost or applied twice"
        assert reader.get("log") == "".join(f"{i}," for i in range(done)).encode()
        assert reader.queue_len("q") == done
        assert [reader.queue_pop("q", False) for _ in range(3)] == [b"0", b"1", b"2"]
