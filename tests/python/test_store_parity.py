"""One scenario per torch Store behaviour, run against torch and ferrodist alike.

Each test takes ``impl``, the namespace under test (``torch.distributed`` or ``ferrodist``), and
drives the same calls through it: servers and clients, prefix stores, Python stores, the
rendezvous handlers and torchelastic's agent store. The expectations are torch's documented
behaviour (``shared/design/torch-store-protocol.md``), so a test that passes for ``torch`` and
fails for ``ferrodist`` is a drop-in gap.
"""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest
import torch.distributed as tdist
from conftest import TORCH_SIDE_REASON, TORCH_SIDE_SKIPPED

import ferrodist

SHORT = timedelta(milliseconds=200)


# torch 2.4 has no store queues, hence no class of its own for an empty one.
QUEUE_EMPTY = getattr(tdist, "QueueEmptyError", tdist.DistStoreError)


@pytest.fixture(params=["torch", "ferrodist"])
def impl(request: pytest.FixtureRequest) -> ModuleType:
    if request.param == "torch" and TORCH_SIDE_SKIPPED:
        pytest.skip(TORCH_SIDE_REASON)
    return tdist if request.param == "torch" else ferrodist


def _stores(impl: ModuleType, tmp_path: Path) -> dict[str, Callable[[], Any]]:
    return {
        "hash": impl.HashStore,
        "file": lambda: impl.FileStore(str(tmp_path / "store"), 1),
        "tcp": lambda: impl.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10)),
        "prefix": lambda: impl.PrefixStore("job", impl.HashStore()),
    }


@pytest.mark.parametrize("kind", ["hash", "file", "tcp", "prefix"])
def test_key_value_calls_answer_as_torch(impl: ModuleType, kind: str, tmp_path: Path) -> None:
    store = _stores(impl, tmp_path)[kind]()
    store.set("k", "v")
    store.set(b"bk", b"\x00\xff")
    assert store.get("k") == b"v" and store.get("bk") == b"\x00\xff"
    assert store.add("n", 5) == 5 and store.add("n", -2) == 3
    assert store.compare_set("k", "v", "w") == b"w"
    assert store.compare_set("k", "nope", "x") == b"w"
    assert store.check(["k", "n"]) and not store.check(["k", "absent"])
    assert store.delete_key("k") and not store.check(["k"])
    store.append("log", "a")
    store.append("log", b"b")
    assert store.get("log") == b"ab"
    store.multi_set(["m1", "m2"], ["1", b"2"])
    assert store.multi_get(["m1", "m2"]) == [b"1", b"2"]
    store.wait(["m1"], SHORT)


@pytest.mark.parametrize("kind", ["hash", "file", "tcp", "prefix"])
def test_a_missing_key_times_out_as_a_dist_store_error(
    impl: ModuleType, kind: str, tmp_path: Path
) -> None:
    store = _stores(impl, tmp_path)[kind]()
    store.set_timeout(SHORT)
    assert store.timeout == SHORT
    with pytest.raises(RuntimeError, match=r"[Tt]imeout"):
        store.get("never")
    with pytest.raises(RuntimeError, match=r"[Tt]imeout"):
        store.wait(["never"], SHORT)


def test_a_negative_wait_timeout_on_a_hash_store_times_out_at_once(impl: ModuleType) -> None:
    with pytest.raises(tdist.DistStoreError):
        impl.HashStore().wait(["never"], timedelta(seconds=-1))


def test_queues_and_the_legacy_gate(impl: ModuleType) -> None:
    store = impl.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10))
    store.queue_push("q", "a")
    store.queue_push("q", b"b")
    assert store.queue_len("q") == 2 and store.queue_len("none") == 0
    assert store.queue_pop("q") == b"a" and store.queue_pop("q", False) == b"b"
    with pytest.raises(QUEUE_EMPTY):
        store.queue_pop("q", False)
    legacy = impl.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10), use_libuv=False)
    assert not legacy.libuvBackend
    with pytest.raises(NotImplementedError, match="legacy TCPStore backend"):
        legacy.queue_push("q", "a")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["hash", "prefix"])
def test_a_blocking_pop_that_loses_the_race_keeps_waiting(impl: ModuleType, kind: str) -> None:
    # torch's HashStore waits and pops under one lock, so a consumer beaten to an element waits
    # on for the next one; ferrodist's used to raise QueueEmptyError there.
    store = _stores(impl, Path("."))[kind]()
    store.set_timeout(timedelta(seconds=20))
    got: list[object] = []

    def consume() -> None:
        try:
            got.append(store.queue_pop("q"))
        except Exception as err:  # the assertion below shows it
            got.append(err)

    values = [str(i).encode() for i in range(8)]
    consumers = [threading.Thread(target=consume) for _ in values]
    for thread in consumers:
        thread.start()
    time.sleep(0.3)
    for value in values:
        store.queue_push("q", value)
        time.sleep(0.05)
    for thread in consumers:
        thread.join(timeout=30)
    assert sorted(got, key=repr) == values, got


def test_a_client_sees_the_masters_keys_and_clones(impl: ModuleType) -> None:
    master = impl.TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=10), wait_for_workers=False)
    client = impl.TCPStore("127.0.0.1", master.port, 2, False, timedelta(seconds=10))
    assert client.port == master.port and client.host == "127.0.0.1"
    client.set("from-client", "1")
    assert master.get("from-client") == b"1"
    clone = client.clone()
    assert clone.get("from-client") == b"1"
    assert master.has_extended_api() and client.has_extended_api()


def test_a_master_waiting_for_workers_says_how_many_joined(impl: ModuleType) -> None:
    with pytest.raises(tdist.DistStoreError, match=r"1/2 clients joined"):
        impl.TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=1))


def test_world_size_zero_is_a_value_error(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="world size cannot be 0"):
        impl.TCPStore("127.0.0.1", 0, 0, True, SHORT)


def test_a_failed_bind_says_torchs_words(impl: ModuleType) -> None:
    first = impl.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10))
    with pytest.raises(
        tdist.DistNetworkError, match="failed to listen on any local network address"
    ):
        impl.TCPStore("127.0.0.1", first.port, 1, True, timedelta(seconds=2))


def test_a_master_under_the_agent_store_joins_the_agents_server(
    impl: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = impl.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10))
    agent.set("from-agent", "1")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_PORT", str(agent.port))
    worker = impl.TCPStore("127.0.0.1", agent.port, None, True, timedelta(seconds=5))
    assert worker.get("from-agent") == b"1"


def test_multi_tenant_masters_share_one_server(impl: ModuleType) -> None:
    first = impl.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10), multi_tenant=True)
    second = impl.TCPStore(
        "127.0.0.1", first.port, 1, True, timedelta(seconds=10), multi_tenant=True
    )
    first.set("shared", "yes")
    assert second.get("shared") == b"yes"


class _UserStore(tdist.Store):
    """A user's store with no ``wait``: torch's PrefixStore forwards get and multi_get to it."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key: str) -> bytes:
        return self.data[key]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.data[k] for k in keys]


def test_a_prefix_store_forwards_get_to_a_python_store(impl: ModuleType) -> None:
    inner = _UserStore()
    store = impl.PrefixStore("p", inner)
    store.set("a", "1")
    store.set("b", "2")
    assert inner.data["p/a"] == b"1"
    assert store.get("a") == b"1"
    assert store.multi_get(["a", "b"]) == [b"1", b"2"]
    assert store.underlying_store is inner


def test_a_prefix_store_needs_a_store(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="store argument cannot be None"):
        impl.PrefixStore("p", None)


def test_bad_inputs_raise_torchs_classes(impl: ModuleType) -> None:
    tcp = impl.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10))
    for store in (impl.HashStore(), tcp):
        with pytest.raises(TypeError):
            store.add("n", 2**63)
        with pytest.raises(TypeError):
            store.set("\ud800", "v")
    with pytest.raises(tdist.DistStoreError):
        tcp.multi_set(["a", "b"], ["only one"])
    tcp.set("still", "usable")
    assert tcp.get("still") == b"usable"


def test_a_reused_collective_key_is_a_runtime_error(impl: ModuleType) -> None:
    if impl is tdist and not hasattr(tdist, "_StoreCollectives"):
        pytest.skip("this torch has no _StoreCollectives (2.15 removed it)")
    cls = tdist._StoreCollectives if impl is tdist else ferrodist.StoreCollectives
    collectives = cls(impl.HashStore(), 0, 1)
    collectives.broadcast_send("key", b"x", timedelta(seconds=1))
    with pytest.raises(RuntimeError, match="already"):
        collectives.broadcast_send("key", b"x", timedelta(seconds=1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tcp_rendezvous_yields_once(impl: ModuleType) -> None:
    url = f"tcp://127.0.0.1:{_free_port()}"
    handed = impl.rendezvous(url, 0, 1, timeout=timedelta(seconds=10))
    store, rank, world_size = next(handed)
    assert (rank, world_size) == (0, 1)
    assert isinstance(store, impl.TCPStore) and store.libuvBackend
    store.set("k", "v")
    assert store.get("k") == b"v"
    with pytest.raises(RuntimeError, match="re-rendezvous"):
        next(handed)


def test_use_libuv_comes_from_the_url_or_the_environment(
    impl: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"tcp://127.0.0.1:{_free_port()}?use_libuv=0"
    store, _, _ = next(impl.rendezvous(url, 0, 1, timeout=timedelta(seconds=10)))
    assert not store.libuvBackend
    monkeypatch.setenv("USE_LIBUV", "0")
    url = f"tcp://127.0.0.1:{_free_port()}"
    store, _, _ = next(impl.rendezvous(url, 0, 1, timeout=timedelta(seconds=10)))
    assert not store.libuvBackend


def test_env_and_file_rendezvous(
    impl: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    store, rank, world_size = next(impl.rendezvous("env://", timeout=timedelta(seconds=10)))
    assert (rank, world_size) == (0, 1) and isinstance(store, impl.TCPStore)
    path = tmp_path / "rdzv"
    store, rank, world_size = next(impl.rendezvous(f"file://{path}?rank=0&world_size=1"))
    assert (rank, world_size) == (0, 1) and isinstance(store, impl.FileStore)


@pytest.mark.parametrize(
    ("url", "error", "message"),
    [
        ("tcp://127.0.0.1?rank=0&world_size=1", ValueError, "port number missing"),
        ("tcp://127.0.0.1:29999?world_size=1", ValueError, "rank parameter missing"),
        ("file://?rank=0&world_size=1", ValueError, "path missing"),
        ("unknownscheme://x", RuntimeError, "No rendezvous handler for unknownscheme://"),
    ],
)
def test_bad_rendezvous_urls(impl: ModuleType, url: str, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        next(impl.rendezvous(url))


def test_rendezvous_argument_types(impl: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="`url` must be a string"):
        impl.rendezvous(5)
    with pytest.raises(RuntimeError, match="`rank` must be an integer"):
        impl.rendezvous("env://", rank="0")


def test_env_rendezvous_names_a_missing_variable(
    impl: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="environment variable RANK expected, but not set"):
        next(impl.rendezvous("env://"))


def test_a_registered_scheme_is_dispatched_with_rank_and_world_size(impl: ModuleType) -> None:
    seen: list[str] = []

    def handler(url: str, **kwargs: Any) -> Any:
        seen.append(url)
        yield tdist.HashStore(), 1, 2

    scheme = f"parity{impl.__name__.replace('.', '')}"
    tdist.register_rendezvous_handler(scheme, handler)
    _, rank, world_size = next(impl.rendezvous(f"{scheme}://job", 1, 2))
    assert (rank, world_size) == (1, 2)
    assert seen == [f"{scheme}://job?rank=1&world_size=2"]


def test_env_init_wraps_the_store_in_the_namespaces_prefix_store(
    impl: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    impl.init_process_group("gloo", timeout=timedelta(seconds=20))
    try:
        # The group's own prefix store (torch's, in both) wraps the "default_pg" one.
        default_pg = tdist.distributed_c10d._get_default_store().underlying_store
        assert isinstance(default_pg, impl.PrefixStore)
        assert isinstance(default_pg.underlying_store, impl.TCPStore)
    finally:
        impl.destroy_process_group()


def test_hash_store_calls_from_many_threads_add_up_beside_a_blocked_wait() -> None:
    # In-memory calls that wait for no key keep the GIL (rust/python/blocking.rs `quick`, and a
    # GET of a key that is there: Store::get_now); a blocked wait or get still releases it, or
    # the setters below could never run.
    store = ferrodist.HashStore()
    waited: list[object] = []
    waiter = threading.Thread(
        target=lambda: waited.append(store.wait(["done"], timedelta(seconds=30)) is None)
    )
    getter = threading.Thread(target=lambda: waited.append(store.get("done")))
    waiter.start()
    getter.start()

    def adds() -> None:
        for _ in range(5000):
            store.add("n", 1)

    adders = [threading.Thread(target=adds) for _ in range(4)]
    for t in adders:
        t.start()
    for t in adders:
        t.join()
    store.set("done", "1")
    waiter.join(timeout=30)
    getter.join(timeout=30)
    assert sorted(map(repr, waited)) == sorted(map(repr, [True, b"1"]))
    assert store.add("n", 0) == 20000
