"""Drop-in gaps torch's own store tests found, one regression test each (ferrodist's side of what
``test_store_parity.py`` checks against torch and ferrodist alike)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from types import ModuleType

import pytest
import torch.distributed as tdist
from conftest import TORCH_SIDE_REASON, TORCH_SIDE_SKIPPED

import ferrodist

VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)


def _frame(opcode: int, *parts: bytes) -> bytes:
    return bytes([opcode]) + b"".join(struct.pack("<Q", len(p)) + p for p in parts)


def _ping(nonce: int) -> bytes:
    return bytes([13]) + struct.pack("<I", nonce)


def _wait(*keys: bytes) -> bytes:
    return _frame(6, *keys)[:1] + struct.pack("<Q", len(keys)) + _frame(6, *keys)[1:]


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


@pytest.fixture
def ping_only_server() -> Iterator[int]:
    """A minimal torch-protocol server: it checks VALIDATE, echoes PING, and reads (but never
    answers) anything else, as a proxy or a stripped-down server might."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(10)
                try:
                    assert _read(conn, 5) == VALIDATE
                    opcode, nonce = _read(conn, 1), _read(conn, 4)
                    assert opcode == b"\x0d"
                    conn.sendall(nonce)
                    while conn.recv(4096):
                        pass
                except (OSError, ConnectionError, AssertionError):
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    stop.set()
    thread.join(5)
    listener.close()


def test_the_client_needs_no_reply_beyond_torchs_handshake(ping_only_server: int) -> None:
    started = time.monotonic()
    store = ferrodist.TCPStore("127.0.0.1", ping_only_server, timeout=timedelta(seconds=3))
    store.set("k", "v")  # fire-and-forget, as torch's client sends it
    assert time.monotonic() - started < 2.0, "the handshake waited for a reply that never came"


def _masters() -> dict[str, ModuleType]:
    return {"torch": tdist, "ferrodist": ferrodist}


@pytest.mark.parametrize("impl", ["torch", "ferrodist"])
def test_a_stock_clients_request_behind_a_wait_is_answered_at_once(impl: str) -> None:
    if impl == "torch" and TORCH_SIDE_SKIPPED:
        pytest.skip(TORCH_SIDE_REASON)
    master = _masters()[impl].TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10))
    with socket.create_connection(("127.0.0.1", master.port), timeout=10) as conn:
        conn.sendall(VALIDATE + _ping(1234))
        assert _read(conn, 4) == struct.pack("<I", 1234)
        conn.sendall(_wait(b"/k") + _frame(3, b"/k") + _ping(9))
        # Both of torch's servers: the GET of a missing key answers empty, the PING its echo,
        # and STOP_WAITING comes once the key is set.
        assert _read(conn, 8) == struct.pack("<Q", 0)
        assert _read(conn, 4) == struct.pack("<I", 9)
        master.set("k", "v")
        assert _read(conn, 1) == b"\x00"


def test_connect_keeps_trying_until_its_whole_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    started = time.monotonic()
    with pytest.raises(tdist.DistNetworkError, match=r"attempts over (\d+)ms") as caught:
        ferrodist.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=2))
    elapsed = time.monotonic() - started
    assert 1.95 <= elapsed < 3.0, elapsed
    tried_ms = int(str(caught.value).split("attempts over ")[1].split("ms")[0])
    assert tried_ms >= 1950


def test_a_server_that_starts_late_in_the_window_is_found() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    hosts: list[ferrodist.TCPStore] = []
    late = threading.Timer(
        1.6, lambda: hosts.append(ferrodist.TCPStore("127.0.0.1", port, None, True))
    )
    late.start()
    try:
        client = ferrodist.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=2.2))
        client.set("k", "v")
        assert client.get("k") == b"v"
    finally:
        late.join()


def test_add_on_a_non_integer_says_so_on_a_tcp_store() -> None:
    master = ferrodist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10))
    master.set("k", "secret-value")
    with pytest.raises(ValueError, match="not a decimal integer") as caught:
        master.add("k", 1)
    assert isinstance(caught.value, tdist.DistStoreError)
    assert "secret-value" not in str(caught.value) and "crash" not in str(caught.value)
    assert master.add("n", 2) == 2, "the store is usable after the refused add"


def test_a_negative_or_wrong_timeout_gets_a_short_clear_error() -> None:
    store = ferrodist.HashStore()
    with pytest.raises(ferrodist.StoreTimeoutError):
        store.wait(["never"], timedelta(seconds=-1))
    with pytest.raises(TypeError, match=r"timeout must be a datetime\.timedelta") as caught:
        store.wait(["never"], "soon")  # type: ignore[arg-type]
    assert len(str(caught.value)) < 120


def test_rendezvous_is_torchs_function_not_a_module() -> None:
    assert callable(ferrodist.rendezvous)
    assert "rendezvous" in ferrodist.__all__


@pytest.mark.timeout(120)
def test_torch_rpc_shares_the_default_groups_tcp_port() -> None:
    rpc = pytest.importorskip("torch.distributed.rpc")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ferrodist.init_process_group("gloo", init_method=url, rank=0, world_size=1)
    try:
        options = rpc.TensorPipeRpcBackendOptions(init_method=url, rpc_timeout=30)
        rpc.init_rpc("worker0", rank=0, world_size=1, rpc_backend_options=options)
        try:
            assert rpc.rpc_sync("worker0", max, args=(3, 4)) == 4
        finally:
            rpc.shutdown()
    finally:
        ferrodist.destroy_process_group()


def test_a_request_over_a_limit_is_refused_before_sending_and_costs_nothing_after() -> None:
    master = ferrodist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10))
    with pytest.raises(ValueError, match=r"key of 819[34] bytes is over the limit of 8192"):
        master.set("k" * 8193, "v")
    with pytest.raises(ferrodist.InvalidArgumentError, match="over the limit of 8388608"):
        master.set("big", b"x" * (8 * 1024 * 1024 + 1))
    with pytest.raises(ValueError, match="over the limit"):
        master.get("k" * 8193)
    master.set("next", "call")
    assert master.get("next") == b"call", "the refused requests cost the next call nothing"


@pytest.mark.timeout(60)
def test_a_large_set_to_a_slow_reader_ends_within_the_timeout() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def trickle() -> None:  # the handshake, then 64 KiB a second
        conn, _ = listener.accept()
        with conn:
            _read(conn, 5)
            _read(conn, 1)
            conn.sendall(_read(conn, 4))
            while not stop.wait(1.0):
                if not conn.recv(64 * 1024):
                    return

    reader = threading.Thread(target=trickle, daemon=True)
    reader.start()
    store = ferrodist.TCPStore(
        "127.0.0.1", int(listener.getsockname()[1]), timeout=timedelta(seconds=2)
    )
    started = time.monotonic()
    with pytest.raises(tdist.DistNetworkError):
        store.set("big", b"x" * (8 * 1024 * 1024))
    assert time.monotonic() - started < 4.0, "the deadline restarted on each partial write"
    stop.set()
    reader.join(5)
    listener.close()


def test_a_wait_in_one_thread_blocks_no_other_threads_call() -> None:
    store = ferrodist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10))
    outcome: list[BaseException] = []

    def wait_for_nothing() -> None:
        try:
            store.wait(["never"], timedelta(seconds=2))
        except tdist.DistStoreError as timed_out:
            outcome.append(timed_out)

    waiting = threading.Thread(target=wait_for_nothing)
    waiting.start()
    time.sleep(0.2)  # the wait is on the wire now
    started = time.monotonic()
    store.set("k", "v")
    assert store.get("k") == b"v"
    assert time.monotonic() - started < 0.5, "the set queued behind the other thread's wait"
    waiting.join(10)
    assert len(outcome) == 1, "the wait still timed out on its own"


@pytest.mark.timeout(60)
def test_a_store_keeps_working_in_the_parent_and_a_forked_child() -> None:
    import multiprocessing

    store = ferrodist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10))
    store.set("from-parent", "1")
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def child() -> None:  # the child reuses the inherited store object itself
        results.put(store.get("from-parent"))
        store.set("from-child", "2")

    process = context.Process(target=child)
    process.start()
    process.join(30)
    assert process.exitcode == 0
    assert results.get(timeout=5) == b"1"
    assert store.get("from-child") == b"2"
    store.set("parent-again", "3")
    assert store.get("parent-again") == b"3", "the child did not disturb the parent's stream"


def test_a_connect_timeout_is_a_network_error_and_a_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with pytest.raises(ferrodist.NetworkTimeoutError) as caught:
        ferrodist.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=0.3))
    assert isinstance(caught.value, tdist.DistNetworkError)  # torch's class for this
    assert isinstance(caught.value, TimeoutError)
    assert "has timed out after 300ms while trying to connect" in str(caught.value)
