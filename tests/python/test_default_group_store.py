"""The store under the default group, as torch's test of the legacy (non-libuv) TCPStore reads it.

torch's test initializes a one-rank gloo group with ``USE_LIBUV=0`` (``env://``) or
``tcp://host:port?use_libuv=0``, takes ``distributed_c10d._get_process_group_store(WORLD)``,
expects a ``PrefixStore``, follows ``underlying_store`` while the store is a ``PrefixStore`` and
expects a ``TCPStore`` whose ``libuvBackend`` is False. torch always wraps a group's store in its
own ``PrefixStore``, so this passes under ferrodist only if the ``isinstance`` checks hold across
torch's classes and ferrodist's (``ferrodist.stores._kinship``). The scenario runs for every
combination of who initializes the group (torch; ferrodist; torch on a port a ferrodist server
already serves in this process, so ferrodist's rendezvous wrapper hands torch ferrodist's store)
and whose names the checks use, over ``env://`` and ``tcp://``, with libuv off and on.

Whatever fails, no default group may stay behind for the next test: the scenario's checks run
under a fixture that destroys it, and a failed ``init_process_group`` must not leave one.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

import pytest
import torch.distributed as tdist
from torch.distributed import distributed_c10d

import ferrodist

TIMEOUT = timedelta(seconds=20)


def _init_args(
    kind: str, port: int, libuv: bool, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """``init_process_group`` arguments that ask for the legacy backend (or libuv) as torch's
    test does: ``USE_LIBUV`` with ``env://``, ``?use_libuv=`` in a ``tcp://`` URL."""
    if kind == "env":
        monkeypatch.setenv("USE_LIBUV", "1" if libuv else "0")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
        url = "env://"
    else:
        monkeypatch.delenv("USE_LIBUV", raising=False)
        url = f"tcp://127.0.0.1:{port}?use_libuv={int(libuv)}"
    return {"init_method": url, "rank": 0, "world_size": 1, "timeout": TIMEOUT}


def _innermost(store: Any, names: ModuleType) -> Any:
    """torch's test's walk: ``underlying_store`` while the store is a ``names.PrefixStore``."""
    while isinstance(store, names.PrefixStore):
        store = store.underlying_store
    return store


def _one_more_key_below(store: Any, innermost: Any) -> bool:
    """Whether a new key set through ``store`` adds one key to ``innermost``. A group that
    ferrodist initialized also has its flight recorder's watchdog thread setting its first keys
    (the job's and this rank's summary) in the same store, which can land between the two
    counts: those are new keys only once, so a few tries with fresh probes settle it, while a
    walk that found the wrong store never sees its count move with the probe."""
    for attempt in range(5):
        before = innermost.num_keys()
        store.set(f"probe/{attempt}", "1")
        if innermost.num_keys() == before + 1:
            return True
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ferrodist_server() -> ferrodist.TCPStore:
    """A ferrodist server this process hosts, as a job that runs its own store would."""
    return ferrodist.TCPStore(
        "127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False, multi_tenant=True
    )


@pytest.mark.parametrize("libuv", [False, True], ids=["legacy", "libuv"])
@pytest.mark.parametrize("kind", ["env", "tcp"])
@pytest.mark.parametrize("names", ["torch", "ferrodist"])
@pytest.mark.parametrize("initialized_by", ["torch", "ferrodist", "torch-on-ferrodist-port"])
def test_the_default_groups_store_is_a_prefix_store_over_the_tcp_store_asked_for(
    leaves_no_group: None,
    monkeypatch: pytest.MonkeyPatch,
    initialized_by: str,
    names: str,
    kind: str,
    libuv: bool,
) -> None:
    checks = tdist if names == "torch" else ferrodist
    server: Optional[ferrodist.TCPStore] = None
    init: Callable[..., None] = tdist.init_process_group
    if initialized_by == "ferrodist":
        init = ferrodist.init_process_group
    if initialized_by == "torch-on-ferrodist-port":
        server = _ferrodist_server()
        port = server.port
    else:
        port = _free_port()
    try:
        init("gloo", **_init_args(kind, port, libuv, monkeypatch))
        store = distributed_c10d._get_process_group_store(checks.group.WORLD)
        assert isinstance(store, checks.PrefixStore)
        innermost = _innermost(store, checks)
        assert isinstance(innermost, checks.TCPStore)
        assert innermost.libuvBackend is libuv
        # the store the walk found is the one under the group's: a key set above lands in it
        assert _one_more_key_below(store, innermost)
        expected = ferrodist.TCPStore if initialized_by != "torch" else tdist.TCPStore
        assert type(innermost) is expected  # ferrodist's rendezvous made it, or torch's
        checks.destroy_process_group()
        assert not tdist.is_initialized()
    finally:
        if server is not None:
            server._stop_server()


PAIRS: list[tuple[str, Callable[[ModuleType, Path], Any]]] = [
    ("TCPStore", lambda m, _: m.TCPStore("127.0.0.1", 0, 1, True, TIMEOUT)),
    ("PrefixStore", lambda m, _: m.PrefixStore("job", m.HashStore())),
    ("FileStore", lambda m, tmp: m.FileStore(str(tmp / m.__name__), 1)),
    ("HashStore", lambda m, _: m.HashStore()),
]


@pytest.mark.parametrize("name,make", PAIRS, ids=[name for name, _ in PAIRS])
def test_each_store_class_counts_the_other_sides_instances(
    name: str, make: Callable[[ModuleType, Path], Any], tmp_path: Path
) -> None:
    ours_cls, theirs_cls = getattr(ferrodist, name), getattr(tdist, name)
    ours, theirs = make(ferrodist, tmp_path), make(tdist, tmp_path)
    assert type(ours) is ours_cls and type(theirs) is theirs_cls  # type() is untouched
    assert theirs_cls not in ours_cls.__mro__  # nor the class hierarchy
    for cls in (ours_cls, theirs_cls):
        assert isinstance(ours, cls) and isinstance(theirs, cls)
        assert issubclass(ours_cls, cls) and issubclass(theirs_cls, cls)
    for other, _ in PAIRS:  # kinship is per pair, never across kinds
        if other != name:
            assert not isinstance(ours, getattr(tdist, other))
            assert not isinstance(theirs, getattr(ferrodist, other))
            assert not issubclass(ours_cls, getattr(tdist, other))

    class Narrower(ours_cls):  # type: ignore[misc, valid-type]
        pass

    assert not isinstance(theirs, Narrower)  # a subclass keeps the ordinary checks
    assert not issubclass(theirs_cls, Narrower)


class _RefusesTheInitBarrier(ferrodist.HashStore):
    """A store whose every call works except the barrier torch runs at the end of
    ``init_process_group`` with ``TORCH_DIST_INIT_BARRIER=1``, after it registered the group."""

    def add(self, key: str, value: int) -> int:  # type: ignore[override]
        if "store_based_barrier" in str(key):
            raise tdist.DistStoreError(f"refused {key}")
        return super().add(key, value)


def test_a_failed_init_after_the_group_was_registered_leaves_no_group(
    leaves_no_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_DIST_INIT_BARRIER", "1")
    raised = []
    for init in (tdist.init_process_group, ferrodist.init_process_group):
        with pytest.raises(tdist.DistStoreError, match="refused store_based_barrier") as caught:
            init("gloo", store=_RefusesTheInitBarrier(), rank=0, world_size=1)
        raised.append(type(caught.value))
        if init is ferrodist.init_process_group:
            assert not tdist.is_initialized()
        elif tdist.is_initialized():  # torch keeps the group it registered: not ours to fix
            tdist.destroy_process_group()
    assert raised[0] is raised[1]
    ferrodist.init_process_group("gloo", store=ferrodist.HashStore(), rank=0, world_size=1)
    assert tdist.get_world_size() == 1


@pytest.mark.filterwarnings("ignore:Device capability of no-such-backend unknown")
@pytest.mark.parametrize("kind", ["env", "tcp"])
def test_a_failed_init_after_the_rendezvous_stops_its_server(
    leaves_no_group: None, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    port = _free_port()
    args = _init_args(kind, port, False, monkeypatch)
    # torch refuses the backend only after ferrodist's rendezvous started a server for it
    refused = (AssertionError, ValueError, RuntimeError)
    with pytest.raises(refused, match=r"(?i)no-such-backend") as e:
        ferrodist.init_process_group("no-such-backend", **args)
    assert e.value.__traceback__ is not None  # its frames, which hold the store, are alive
    assert not tdist.is_initialized()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    ferrodist.init_process_group("gloo", **args)  # the same port serves a fresh rendezvous
    ferrodist.destroy_process_group()
