"""Jobs sharing one real etcd cluster cannot touch each other (issue 27, items 4 and 11).

A job prefix is checked wherever one is chosen (``EtcdStore``, ``etcd://`` URLs, the torchrun
backend, ``ferrodist-store --backend``); a store given none takes torchrun's run id or refuses
to guess; no job's etcd range holds another's keys, so ``purge`` ends one job only; and a
scripted client of another job tries every store call, with tricky keys, directly, through
``PrefixStore``s and through an etcd-backed ``ferrodist-store``, against a victim's keys, which
stay exactly as they were (each etcd key's value and modification revision).
"""

from __future__ import annotations

import base64
import json
import urllib.request
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as tdist
from etcd_support import EtcdCluster
from tcp_support import StoreServer
from torch.distributed.elastic.rendezvous import RendezvousParameters

import ferrodist
from ferrodist.rdzv import elastic as elastic_rendezvous

pytestmark = pytest.mark.timeout(180)

TIMEOUT = timedelta(seconds=10)
SHORT = timedelta(milliseconds=50)
RUN_ID = "TORCHELASTIC_RUN_ID"

BAD_PREFIXES = ["", "/", "a/", "/a", "a//b", "a:b", "a b", "..", "a/../b", "ä", "a\nb", "x" * 256]


def _store(cluster: EtcdCluster, prefix: str) -> ferrodist.EtcdStore:
    return ferrodist.EtcdStore(cluster.endpoints, prefix, TIMEOUT)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def raw_job(cluster: EtcdCluster, prefix: str) -> list[tuple[bytes, bytes, str]]:
    """Every etcd key of job ``prefix`` (the range ``prefix:``) with its value and modification
    revision, read through etcd's own HTTP gateway, not through ferrodist."""
    start = f"{prefix}:".encode()
    end = start[:-1] + bytes([start[-1] + 1])
    body = json.dumps({"key": _b64(start), "range_end": _b64(end)}).encode()
    url = f"http://{cluster.endpoint_list()[0]}/v3/kv/range"
    request = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=5) as reply:
        kvs = json.loads(reply.read()).get("kvs", [])
    return [
        (base64.b64decode(kv["key"]), base64.b64decode(kv.get("value", "")), kv["mod_revision"])
        for kv in kvs
    ]


def populated(cluster: EtcdCluster, prefix: str) -> ferrodist.EtcdStore:
    """A job with values, a counter (and so a receipt) and a queue."""
    store = _store(cluster, prefix)
    store.set("k", prefix)
    store.set("kv/k", "nested-looking")
    store.set("/torch/wire", "w")
    store.add("n", 7)
    store.queue_push("q", "x")
    return store


def test_a_prefix_that_is_empty_odd_or_could_nest_is_a_value_error_naming_it(
    etcd_cluster: EtcdCluster,
) -> None:
    for bad in BAD_PREFIXES:
        with pytest.raises(ValueError, match="'prefix'"):
            _store(etcd_cluster, bad)
    for bad in ("a//b", "a:b", "a%20b"):
        url = f"etcd://{etcd_cluster.endpoint_list()[0]}/{bad}?rank=0&world_size=1"
        with pytest.raises(ValueError, match=r"etcd:// rendezvous: the job name .*'prefix'"):
            next(ferrodist.rendezvous(url))


def test_ferrodist_store_refuses_a_backend_prefix_that_could_nest(
    etcd_cluster: EtcdCluster,
) -> None:
    with pytest.raises(RuntimeError, match="'prefix'"):
        StoreServer("--backend", f"etcd://{etcd_cluster.endpoints}/a//b")


def _params(endpoint: str, run_id: str, **conf: Any) -> RendezvousParameters:
    return RendezvousParameters(
        backend=elastic_rendezvous.BACKEND_NAME,
        endpoint=endpoint,
        run_id=run_id,
        min_nodes=1,
        max_nodes=1,
        **conf,
    )


def test_the_torchrun_backend_needs_a_run_id_of_its_own(etcd_cluster: EtcdCluster) -> None:
    endpoints = etcd_cluster.endpoints
    with pytest.raises(ValueError, match="--rdzv-id"):
        elastic_rendezvous.create_handler(_params(endpoints, "none"))
    with pytest.raises(ValueError, match=r"--rdzv-id make the job's etcd prefix.*'prefix'"):
        elastic_rendezvous.create_handler(_params(endpoints, "job 7"))
    with pytest.raises(ValueError, match="'prefix'"):
        elastic_rendezvous.create_handler(_params(endpoints, "job-7", prefix="a//b"))


def test_a_store_named_by_no_one_takes_torchruns_run_id_or_refuses_to_guess(
    etcd_cluster: EtcdCluster, etcd_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RUN_ID, raising=False)
    with pytest.raises(ValueError, match=f"'prefix' is needed here \\(no {RUN_ID}"):
        ferrodist.EtcdStore(etcd_cluster.endpoints)
    monkeypatch.setenv(RUN_ID, "none")  # torchrun without --rdzv-id: every such run's id
    with pytest.raises(ValueError, match="'prefix' is needed here"):
        ferrodist.EtcdStore(etcd_cluster.endpoints, timeout=TIMEOUT)
    monkeypatch.setenv(RUN_ID, "my run")
    with pytest.raises(ValueError, match=f"{RUN_ID} \\('my run'\\) does not make one"):
        ferrodist.EtcdStore(etcd_cluster.endpoints)

    monkeypatch.setenv(RUN_ID, f"{etcd_prefix}-1")
    one, same_run = (
        ferrodist.EtcdStore(etcd_cluster.endpoints),
        ferrodist.EtcdStore(etcd_cluster.endpoints),
    )
    assert one.prefix == f"ferrodist/{etcd_prefix}-1" == same_run.prefix
    monkeypatch.setenv(RUN_ID, f"{etcd_prefix}-2")
    other = ferrodist.EtcdStore(etcd_cluster.endpoints)
    one.set("k", "1")
    other.set("k", "2")
    assert same_run.get("k") == b"1", "ranks of one run share the store"
    assert one.purge() >= 1
    assert other.get("k") == b"2", "another run's purge left this run's keys"
    assert other.purge() >= 1


def test_purging_a_job_leaves_jobs_whose_names_extend_it_whole(
    etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    job = f"{etcd_prefix}/a"
    others = [f"{job}/b", f"{etcd_prefix}/ab", f"{job}/kv", f"{job}.kv"]
    stores = [populated(etcd_cluster, p) for p in others]
    before = [raw_job(etcd_cluster, p) for p in others]
    assert all(len(keys) >= 5 for keys in before), before
    purged = populated(etcd_cluster, job)
    own = len(raw_job(etcd_cluster, job))
    assert purged.purge() == own, "purge deletes exactly the job's own keys"
    assert raw_job(etcd_cluster, job) == []
    assert [raw_job(etcd_cluster, p) for p in others] == before
    for store, prefix in zip(stores, others):
        assert store.get("k") == prefix.encode()
        store.purge()


def test_a_key_of_one_job_is_never_a_key_of_another(
    etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    outer, inner = (
        _store(etcd_cluster, f"{etcd_prefix}/a"),
        _store(etcd_cluster, f"{etcd_prefix}/a/kv"),
    )
    inner.set("k", "inner")
    outer.set("kv/k", "outer")
    assert inner.get("k") == b"inner" and outer.get("kv/k") == b"outer"
    assert inner.list_keys() == ["k"] and outer.list_keys() == ["kv/k"]
    outer.purge()
    assert inner.get("k") == b"inner"
    inner.purge()


def tricky_keys(victim: str) -> list[str]:
    """Keys an attacker might hope escape its own job."""
    tail = victim.rsplit("/", 1)[-1]
    return [
        "", "/", "//", "..", "../", ":", "k", "kv/k", "q", "n", "../k", "../../k", "\x00",
        f"../{tail}:kv/k", f"{victim}:kv/k", ":kv/k", f"/../{tail}/kv/k", "x" * 65536,
    ]  # fmt: skip


def attack(store: Any, keys: list[str], extended: bool = True, deletes: bool = True) -> None:
    """Every call a client of another job has, with every key: reads first (it must see
    nothing), then writes, counts, swaps, deletes, queues, and lists only its own keys.
    ``extended``: the calls beyond torch's base Store; ``deletes``: ``delete_key`` (torch's
    PrefixStore has none)."""
    for key in keys:
        assert not store.check([key]), f"{key[:20]!r} visible"
        with pytest.raises(tdist.DistStoreError):
            store.wait([key], SHORT)
        assert not deletes or not store.delete_key(key)
        if extended:
            assert store.queue_len(key) == 0
    store.set_timeout(SHORT)
    with pytest.raises(tdist.DistStoreError):
        store.get(keys[0])
    if extended:
        with pytest.raises(tdist.DistStoreError):
            store.multi_get(keys[:3])
    store.set_timeout(TIMEOUT)
    for key in keys:
        store.set(key, "attacker")
        assert store.get(key) == b"attacker"
        assert store.compare_set(key, "attacker", "swapped") == b"swapped"
        if deletes:
            assert store.delete_key(key)
            assert store.add(key, 1) == 1
        if extended:
            store.append(key, "+")
            store.queue_push(key, "p")
            assert store.queue_pop(key, False) == b"p"
    if extended:
        store.multi_set(keys, ["m"] * len(keys))
        assert store.multi_get(keys) == [b"m"] * len(keys)
        assert sorted(store.list_keys()) == sorted(keys), "it lists only its own keys"
        assert store.num_keys() == len(keys)


def test_a_client_of_another_job_cannot_read_write_list_delete_or_purge_a_victims_keys(
    etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    victim_prefix = f"{etcd_prefix}/victim"
    victim = populated(etcd_cluster, victim_prefix)
    before = raw_job(etcd_cluster, victim_prefix)
    assert len(before) >= 5, before
    keys = tricky_keys(victim_prefix)
    # The attacker's own job: the victim's parent, child, name-sibling, or one ending in a
    # layout word.
    for prefix in (
        etcd_prefix,
        f"{victim_prefix}/x",
        f"{victim_prefix}x",
        f"{victim_prefix}/kv",
        f"{victim_prefix}/queue",
    ):
        attacker = _store(etcd_cluster, prefix)
        assert attacker.num_keys() == 0 and attacker.list_keys() == []
        attack(attacker, keys)
        assert attacker.purge() > 0
        # torch's PrefixStore and ferrodist's over the attacker's store: still its own job.
        attacker.set_timeout(SHORT)  # torch's PrefixStore reads with the inner store's timeout
        attack(tdist.PrefixStore("..", attacker), keys[:8], extended=False, deletes=False)
        attacker.set_timeout(TIMEOUT)
        assert attacker.purge() > 0
        attack(ferrodist.PrefixStore("../v", attacker), keys[:8], extended=False)
        assert attacker.purge() > 0
        assert raw_job(etcd_cluster, victim_prefix) == before, f"job {prefix!r} reached it"
    # A stock torch client of an etcd-backed ferrodist-store serving the parent job.
    server = StoreServer("--backend", f"etcd://{etcd_cluster.endpoints}/{etcd_prefix}")
    try:
        client = tdist.TCPStore(
            "127.0.0.1", server.port, is_master=False, timeout=TIMEOUT, wait_for_workers=False
        )
        attack(client, keys[:-1], extended=False)
        assert client.num_keys() == len(keys) - 1
        _store(etcd_cluster, etcd_prefix).purge()
    finally:
        server.stop()
    assert raw_job(etcd_cluster, victim_prefix) == before, "the server's client reached it"
    assert victim.get("k") == victim_prefix.encode() and victim.queue_len("q") == 1
    victim.purge()
