"""Wire compatibility both ways, with real processes: torch's clients against ferrodist's
server, ferrodist's client against torch's libuv and legacy servers.

Every combination runs the same script of Store calls (``tcp_support.exercise``) and must give
exactly what torch's own client gets from torch's own server: values, counts, errors and their
messages. ferrodist's messages are torch 2.13's (they name the missing keys); on a torch whose
messages differ (2.4 says ``Socket Timeout``) the errors' classes must still match.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as tdist
from tcp_support import exercise, ferrodist_store, torch_servers

import ferrodist

pytestmark = pytest.mark.timeout(120)

TIMEOUT = timedelta(seconds=10)


def torch_client(port: int, **kwargs: Any) -> tdist.TCPStore:
    return tdist.TCPStore("127.0.0.1", port, timeout=TIMEOUT, **kwargs)


def ferrodist_client(port: int, **kwargs: Any) -> ferrodist.TCPStore:
    return ferrodist.TCPStore("127.0.0.1", port, timeout=TIMEOUT, **kwargs)


@pytest.fixture(scope="module")
def torch_ports() -> Iterator[tuple[list[int], list[int]]]:
    """Fresh torch servers: (libuv ports, legacy ports), three of each."""
    with torch_servers(3) as ports:
        yield ports


@pytest.fixture(scope="module")
def reference(torch_ports: tuple[list[int], list[int]]) -> dict[str, list[Any]]:
    """What torch's client gets from torch's servers."""
    libuv, legacy = torch_ports
    return {
        "libuv": exercise(torch_client(libuv[0])),
        "legacy": exercise(torch_client(legacy[0], use_libuv=False), queues=False),
    }


WAIT_TIMEOUT_2_13 = ("DistStoreError", "wait timeout after 100ms, keys: /never")


def _comparable(out: list[Any], reference: list[Any]) -> list[Any]:
    """``out`` as-is where this torch's messages are 2.13's, else its errors' classes only."""
    if WAIT_TIMEOUT_2_13 in reference:
        return out
    return [item[:1] if isinstance(item, tuple) else item for item in out]


def same(got: list[Any], reference: list[Any]) -> bool:
    return _comparable(got, reference) == _comparable(reference, reference)


def test_reference_is_what_the_protocol_notes_say(reference: dict[str, list[Any]]) -> None:
    ref = reference["libuv"]
    assert ref[0] == b"v"
    assert ref[1:3] == [5, 3]
    assert ref[3:7] == [b"w", b"w", b"x", b"y"]
    if tdist.__dict__.get("QueueEmptyError") is not None:  # the 2.13-era messages
        assert WAIT_TIMEOUT_2_13 in ref
    else:
        assert ("DistStoreError",) in _comparable(ref, ref)


def test_torch_client_against_ferrodist_store(reference: dict[str, list[Any]]) -> None:
    with ferrodist_store() as server:
        assert same(exercise(torch_client(server.port)), reference["libuv"])


def test_torch_legacy_flagged_client_against_ferrodist_store(
    reference: dict[str, list[Any]],
) -> None:
    with ferrodist_store() as server:
        got = exercise(torch_client(server.port, use_libuv=False), queues=False)
        assert same(got, reference["legacy"])


def test_torch_client_against_a_ferrodist_master(reference: dict[str, list[Any]]) -> None:
    master = ferrodist.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT)
    assert same(exercise(torch_client(master.port)), reference["libuv"])


def test_ferrodist_client_against_torch_libuv_server(
    torch_ports: tuple[list[int], list[int]], reference: dict[str, list[Any]]
) -> None:
    assert same(exercise(ferrodist_client(torch_ports[0][1])), reference["libuv"])


def test_ferrodist_client_against_torch_legacy_server(
    torch_ports: tuple[list[int], list[int]], reference: dict[str, list[Any]]
) -> None:
    store = ferrodist_client(torch_ports[1][1], use_libuv=False)
    assert same(exercise(store, queues=False), reference["legacy"])
    with pytest.raises(NotImplementedError, match="legacy TCPStore backend"):
        store.queue_push("q", "x")


def test_ferrodist_client_against_ferrodist_store(reference: dict[str, list[Any]]) -> None:
    with ferrodist_store() as server:
        assert same(exercise(ferrodist_client(server.port)), reference["libuv"])


@pytest.mark.parametrize("backend", ["libuv", "legacy"])
def test_ferrodist_barrier_on_this_torchs_servers(
    torch_ports: tuple[list[int], list[int]], backend: str
) -> None:
    # torch 2.13+ servers take BARRIER; older ones close the connection on it, and ferrodist's
    # client falls back to torch's add + wait barrier. Either way the barrier must hold.
    port = torch_ports[0 if backend == "libuv" else 1][2]
    members = [ferrodist_client(port, use_libuv=backend == "libuv") for _ in range(3)]
    errors: list[BaseException] = []

    def arrive(store: ferrodist.TCPStore) -> None:
        try:
            store.barrier("meet", 3, timedelta(seconds=20))
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=arrive, args=(m,)) for m in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    with pytest.raises(tdist.DistStoreError, match="barrier timeout after 100ms, key: lonely"):
        members[0].barrier("lonely", 2, timedelta(milliseconds=100))
    members[1].set("after", "1")
    assert members[2].get("after") == b"1"


def test_both_clients_share_one_key_space(torch_ports: tuple[list[int], list[int]]) -> None:
    port = torch_ports[0][2]
    ours, theirs = ferrodist_client(port), torch_client(port)
    ours.set("from_ferrodist", "1")
    theirs.set("from_torch", "2")
    assert theirs.get("from_ferrodist") == b"1"
    assert ours.get("from_torch") == b"2"
    if hasattr(theirs, "list_keys"):  # not in torch 2.4
        assert sorted(ours.list_keys()) == sorted(theirs.list_keys())
    # bytes keys name the same key as their text, on both clients
    ours.set(b"as_bytes", "3")
    assert theirs.get("as_bytes") == b"3" == theirs.get(b"as_bytes")
    assert ours.add(b"as_bytes", 1) == 4 == theirs.add("as_bytes", 0)


def test_many_clients_of_both_kinds_are_woken_by_one_set() -> None:
    with ferrodist_store() as server:
        clients: list[Any] = [torch_client(server.port) for _ in range(8)]
        clients += [ferrodist_client(server.port) for _ in range(8)]
        results: list[bytes] = []
        lock = threading.Lock()

        def wait_and_get(store: Any) -> None:
            store.wait(["go"], timedelta(seconds=20))
            value = store.get("go")
            with lock:
                results.append(value)

        threads = [threading.Thread(target=wait_and_get, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        torch_client(server.port).set("go", "now")
        for t in threads:
            t.join(timeout=20)
        assert results == [b"now"] * len(clients)


def test_a_torch_wait_that_times_out_leaves_its_connection_usable() -> None:
    with ferrodist_store() as server:
        store = torch_client(server.port)
        for _ in range(3):
            # torch's own client words it (2.4 says "Socket Timeout").
            expected = r"wait timeout after 50ms|Socket Timeout"
            with pytest.raises(tdist.DistStoreError, match=expected):
                store.wait(["late"], timedelta(milliseconds=50))
        ferrodist_client(server.port).set("late", "ok")
        store.wait(["late"], timedelta(seconds=5))
        assert store.get("late") == b"ok"
        assert store.add("counter", 1) == 1
