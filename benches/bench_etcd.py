"""EtcdStore beside ferrodist's and torch's TCPStore, in one run: single-client ops/s, a
rendezvous of N clients, and a rendezvous during which the etcd leader is killed.

The etcd cluster is 3 members on loopback ports with their data on /dev/shm (tests/python/
etcd_support.py), so etcd's fsync costs nothing here: on real disks each etcd write costs a
disk flush more. All clients run as threads of this one process (so on one core of ferrodist's
runtime for the Rust clients); a real job has them in separate processes and hosts.

A rendezvous is ferrodist's join (``ferrodist.rdzv.join.wait_for_ranks``: each client enrolls
itself and learns how many have, the last one sets a done key, the others wait on it), with each
client on its own connection. On the TCP stores enrolling is an append and an add; on etcd a key
per client counted in the same transaction (``rust/store/etcd/roll.rs``).

    ./scripts/bench benches/bench_etcd.py [--clients 256 1024] [--seconds 0.3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable

import torch.distributed as tdist

import ferrodist
from ferrodist.rdzv import join as _rendezvous

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from bench_stores import _rate  # the same op-rate loop as the other store benches
from etcd_support import EtcdCluster, etcd_cluster

TIMEOUT = timedelta(seconds=120)
KEYS = [f"key{i}" for i in range(64)]


def _ops(store: tdist.Store) -> dict[str, Callable[[int], None]]:
    for k in KEYS:
        store.set(k, "1")

    def sets(n: int) -> None:
        for i in range(n):
            store.set(KEYS[i % 64], "value")

    def gets(n: int) -> None:
        for i in range(n):
            store.get(KEYS[i % 64])

    def adds(n: int) -> None:
        for _ in range(n):
            store.add("counter", 1)

    def checks(n: int) -> None:
        for i in range(n):
            store.check([KEYS[i % 64]])

    return {"set": sets, "get": gets, "add": adds, "check": checks}


def _time_rendezvous(
    make_client: Callable[[int], tdist.Store],
    clients: int,
    fault: Callable[[], None] | None = None,
) -> float:
    """Seconds from the first client's start until every client is through the join; ``fault``
    runs 50 ms after the start, while the clients join."""
    stores = [make_client(rank) for rank in range(clients)]
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            _rendezvous.wait_for_ranks(stores[rank], rank, clients, TIMEOUT, 60)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    if fault is not None:
        time.sleep(0.05)
        fault()
    for t in threads:
        t.join()
    took = time.perf_counter() - start
    if errors:
        raise errors[0]
    return took


def _etcd_client(cluster: EtcdCluster, job: str) -> Callable[[int], tdist.Store]:
    return lambda _: ferrodist.EtcdStore(cluster.endpoints, job, TIMEOUT)


def _tcp_clients(kind: str, clients: int) -> tuple[Callable[[int], tdist.Store], object]:
    """A master of ``kind`` ("ferrodist" or "torch") and a factory of its clients."""
    module = ferrodist if kind == "ferrodist" else tdist
    master = module.TCPStore("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False)
    port = master.port
    return (lambda _: module.TCPStore("127.0.0.1", port, None, False, TIMEOUT)), master


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with etcd_cluster(3) as cluster:
        masters = {k: _tcp_clients(k, 1) for k in ("torch", "ferrodist")}
        stores = {
            "torch TCPStore": masters["torch"][0](0),
            "ferrodist TCPStore": masters["ferrodist"][0](0),
            "EtcdStore": ferrodist.EtcdStore(cluster.endpoints, "bench-ops", TIMEOUT),
        }
        print("single client, ops/s (best of rounds)")
        print(f"| op | {' | '.join(stores)} |")
        print("|---|" + "---:|" * len(stores))
        loops = {name: _ops(store) for name, store in stores.items()}
        for op in ("set", "get", "add", "check"):
            rates = [
                max(_rate(loops[name][op], args.seconds) for _ in range(args.rounds))
                for name in stores
            ]
            print(f"| {op} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |")

        print("\nrendezvous of N clients (ferrodist's join), seconds")
        print(f"| clients | {' | '.join(stores)} |")
        print("|---:|" + "---:|" * len(stores))
        for n in args.clients:
            row = []
            for name in stores:
                if name == "EtcdStore":
                    make = _etcd_client(cluster, f"bench-rdzv-{n}")
                else:
                    kind = "torch" if name.startswith("torch") else "ferrodist"
                    make, _ = _tcp_clients(kind, n)
                row.append(_time_rendezvous(make, n))
            print(f"| {n} | " + " | ".join(f"{t:.2f}" for t in row) + " |")

        n = min(args.clients)
        make = _etcd_client(cluster, "bench-leader-kill")
        took = _time_rendezvous(make, n, fault=lambda: cluster.kill(cluster.leader()))
        print(f"\nrendezvous of {n} EtcdStore clients, etcd leader killed 50 ms in: {took:.2f} s")


if __name__ == "__main__":
    main()
