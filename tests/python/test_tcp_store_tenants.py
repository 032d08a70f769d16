"""One configuration per server (issue 27 item 3): ``multi_tenant`` masters of one process on
one port share one server only when they ask for the same token, limits, stance on stock torch
clients and metrics address; otherwise the second one gets the error a torch user catches for a
bad argument (``ValueError``), naming what differs and never a token's value. The rendezvous
paths that host with ``multi_tenant`` (``env://`` and ``tcp://`` through ``init_process_group``,
ferrodist's and torch's alike) meet the same check."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any, Callable

import pytest
import torch.distributed as tdist

import ferrodist
from ferrodist.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(60)

TIMEOUT = timedelta(seconds=10)
SECRET = "tenant-secret-5b1e"
OTHER = "another-secret-c40d"


@pytest.fixture(autouse=True)
def no_store_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "FERRODIST_STORE_TOKEN",
        "FERRODIST_STORE_TOKEN_FILE",
        "FERRODIST_STORE_METRICS_ADDR",
    ):
        monkeypatch.delenv(name, raising=False)


def tenant(port: int, **kwargs: Any) -> ferrodist.TCPStore:
    return ferrodist.TCPStore(
        "127.0.0.1", port, None, True, TIMEOUT, wait_for_workers=False, multi_tenant=True, **kwargs
    )


def test_masters_asking_for_the_same_configuration_share_one_server() -> None:
    first = tenant(0, auth_token=SECRET, metrics_addr="127.0.0.1:0")
    second = tenant(first.port, auth_token=SECRET, metrics_addr="127.0.0.1:0")
    second.set("k", "v")
    assert first.get("k") == b"v"
    assert second.metrics_addr == first.metrics_addr


MISMATCHES: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("token", {"auth_token": SECRET}, {"auth_token": OTHER}, "auth token differs"),
    ("token-then-none", {"auth_token": SECRET}, {}, "one has a token, the other none"),
    ("none-then-token", {}, {"auth_token": SECRET}, "one has a token, the other none"),
    (
        "torch-clients",
        {"auth_token": SECRET},
        {"auth_token": SECRET, "allow_unauthenticated_torch_clients": True},
        "allow_unauthenticated_torch_clients differs",
    ),
    ("metrics", {"metrics_addr": "127.0.0.1:0"}, {}, "metrics address differs"),
]


@pytest.mark.parametrize(
    ("first_kwargs", "second_kwargs", "named"),
    [m[1:] for m in MISMATCHES],
    ids=[m[0] for m in MISMATCHES],
)
def test_a_master_asking_for_another_configuration_is_refused_naming_it(
    first_kwargs: dict[str, Any], second_kwargs: dict[str, Any], named: str
) -> None:
    first = tenant(0, **first_kwargs)
    first.set("before", "1")
    with pytest.raises(ValueError) as caught:
        tenant(first.port, **second_kwargs)
    assert isinstance(caught.value, InvalidArgumentError)
    assert isinstance(caught.value, tdist.DistStoreError)
    message = str(caught.value)
    assert named in message
    assert str(first.port) in message
    assert SECRET not in message and OTHER not in message
    assert first.get("before") == b"1"  # the running server is untouched


def test_the_token_from_the_environment_counts_as_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    first = tenant(0, auth_token=SECRET)
    monkeypatch.setenv("FERRODIST_STORE_TOKEN", SECRET)
    tenant(first.port).set("k", "v")
    assert first.get("k") == b"v"
    monkeypatch.setenv("FERRODIST_STORE_TOKEN", OTHER)
    with pytest.raises(ValueError, match="auth token differs") as caught:
        tenant(first.port)
    assert SECRET not in str(caught.value) and OTHER not in str(caught.value)


def _url(kind: str, port: int, monkeypatch: pytest.MonkeyPatch) -> str:
    if kind == "env":
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
        return "env://"
    return f"tcp://127.0.0.1:{port}"


INITS: dict[str, Callable[..., None]] = {
    "ferrodist": ferrodist.init_process_group,
    "torch": tdist.init_process_group,
}


@pytest.mark.parametrize("kind", ["env", "tcp"])
@pytest.mark.parametrize("initialized_by", list(INITS))
def test_init_process_group_on_a_port_this_process_serves_meets_the_same_check(
    leaves_no_group: None, monkeypatch: pytest.MonkeyPatch, kind: str, initialized_by: str
) -> None:
    server = tenant(0, auth_token=SECRET)
    init = INITS[initialized_by]
    args = {"rank": 0, "world_size": 1, "timeout": TIMEOUT}
    try:
        monkeypatch.setenv("FERRODIST_STORE_TOKEN", OTHER)
        with pytest.raises(ValueError, match="auth token differs") as caught:
            init("gloo", init_method=_url(kind, server.port, monkeypatch), **args)
        assert SECRET not in str(caught.value) and OTHER not in str(caught.value)
        assert not tdist.is_initialized()

        monkeypatch.setenv("FERRODIST_STORE_TOKEN", SECRET)
        init("gloo", init_method=_url(kind, server.port, monkeypatch), **args)
        assert server.list_keys(), "the group's rendezvous went through the running server"
        ferrodist.destroy_process_group()
    finally:
        server._stop_server()


def test_a_port_freed_by_a_stopped_server_takes_a_new_configuration() -> None:
    first = tenant(0, auth_token=SECRET)
    port = first.port
    first._stop_server()
    del first
    second = tenant(port)
    second.set("k", "v")
    assert second.get("k") == b"v"
    with socket.socket() as s:  # the port is served again
        s.connect(("127.0.0.1", port))
