"""``ferrodist.TCPStore`` as a Python object: torch's constructor, properties and semantics."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as tdist
from _procs import ctrl_c_after
from conftest import TORCH_SIDE_SKIPPED

import ferrodist

pytestmark = pytest.mark.timeout(60)

SHORT = timedelta(seconds=10)


def master(**kwargs: object) -> ferrodist.TCPStore:
    kwargs.setdefault("timeout", SHORT)
    return ferrodist.TCPStore("127.0.0.1", 0, is_master=True, **kwargs)  # type: ignore[arg-type]


def test_port_zero_picks_a_free_port_and_properties_match_torch() -> None:
    store = master(use_libuv=False)
    assert 0 < store.port < 65536
    assert store.host == "127.0.0.1"
    assert store.libuvBackend is False
    assert isinstance(store, tdist.Store)
    assert store.timeout == SHORT
    assert {"host", "port", "libuvBackend"} <= set(dir(store))


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"is_master": 1}, TypeError),
        ({"port": 70000}, TypeError),
        ({"port": "29500"}, TypeError),
        ({"world_size": 0}, ValueError),
    ],
)
def test_bad_arguments_raise_what_torch_raises(kwargs: dict[str, object], error: type) -> None:
    args: dict[str, object] = {"host_name": "127.0.0.1", "port": 0, "is_master": True}
    args.update(kwargs)
    # torch 2.4's TCPStore segfaults on world_size=0 (see conftest.TORCH_SIDE_SKIPPED).
    if not (TORCH_SIDE_SKIPPED and kwargs == {"world_size": 0}):
        with pytest.raises(error):
            tdist.TCPStore(**args)  # type: ignore[arg-type]
    with pytest.raises(error):
        ferrodist.TCPStore(**args)  # type: ignore[arg-type]


def test_master_waits_for_workers_then_counts_them_in_num_keys() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    joined: list[ferrodist.TCPStore] = []

    def join_late() -> None:
        time.sleep(0.3)
        joined.append(ferrodist.TCPStore("127.0.0.1", port, world_size=2, timeout=SHORT))

    thread = threading.Thread(target=join_late)
    thread.start()
    started = time.monotonic()
    store = ferrodist.TCPStore("127.0.0.1", port, world_size=2, is_master=True, timeout=SHORT)
    assert time.monotonic() - started >= 0.25, "the master waited for its worker"
    thread.join()
    assert store.num_keys() == 1, "init/ counts, as in torch"
    assert store.list_keys() == [], "but is not a user key"


def test_master_missing_workers_raises_dist_store_error() -> None:
    with pytest.raises(tdist.DistStoreError, match="1/2 clients joined"):
        master(world_size=2, timeout=timedelta(milliseconds=300))


def test_wait_and_get_timeouts_name_keys_and_leave_the_store_usable() -> None:
    store = master()
    with pytest.raises(tdist.DistStoreError, match=r"wait timeout after 100ms, keys: /a, /b"):
        store.wait(["a", "b"], timedelta(milliseconds=100))
    store.set_timeout(timedelta(milliseconds=250))
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"250ms.*/gone"):
        store.get("gone")
    assert time.monotonic() - started < 2
    store.set("a", "1")
    assert store.get("a") == b"1"


def test_a_get_in_short_slices_is_released_by_another_clients_set() -> None:
    store = master()
    other = store.clone()
    timer = threading.Timer(0.4, lambda: other.set("late", "v"))
    timer.start()
    assert store.get("late") == b"v"
    timer.join()


def test_multi_tenant_masters_share_one_server() -> None:
    first = master(multi_tenant=True)
    second = ferrodist.TCPStore(
        "127.0.0.1", first.port, is_master=True, multi_tenant=True, timeout=SHORT
    )
    second.set("k", "v")
    assert first.get("k") == b"v"
    with pytest.raises(tdist.DistNetworkError):
        ferrodist.TCPStore("127.0.0.1", first.port, is_master=True, timeout=SHORT)


def test_master_listen_fd_serves_on_the_given_socket() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    store = ferrodist.TCPStore(
        "127.0.0.1", port, is_master=True, master_listen_fd=sock.fileno(), timeout=SHORT
    )
    assert store.port == port
    tdist.TCPStore("127.0.0.1", port, timeout=SHORT).set("k", "v")
    assert store.get("k") == b"v"
    sock.close()


def test_torch_takes_it_for_a_process_group_and_a_prefix_store() -> None:
    store = master()
    prefixed = tdist.PrefixStore("pg", store)
    prefixed.set("x", "1")
    assert store.get("pg/x") == b"1"
    tdist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        t = torch.ones(3)
        tdist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        tdist.destroy_process_group()


def test_clone_is_a_client_of_the_same_server() -> None:
    store = master()
    clone = store.clone()
    assert isinstance(clone, ferrodist.TCPStore)
    assert clone.port == store.port
    clone.set("c", "1")
    assert store.get("c") == b"1"


def test_ctrl_c_interrupts_a_long_get_and_the_store_stays_usable() -> None:
    store = master()
    store.set_timeout(timedelta(seconds=30))
    with ctrl_c_after(0.3):
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            store.get("never")
        assert time.monotonic() - started < 5
    # The abandoned wait is cancelled on the next call; the connection carries on.
    store.set("after", "1")
    assert store.get("after") == b"1"
    assert store.add("n", 2) == 2


@pytest.mark.parametrize("seconds", [0.3, 1.0])
def test_a_connect_that_gives_up_says_the_connection_was_refused(seconds: float) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once the probe is closed
    started = time.monotonic()
    with pytest.raises(tdist.DistNetworkError) as caught:
        ferrodist.TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=seconds))
    assert time.monotonic() - started < seconds + 1
    assert isinstance(caught.value, TimeoutError)
    assert "Connection refused" in str(caught.value), str(caught.value)
