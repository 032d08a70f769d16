"""The standalone server as a process: the binary and the console script start, print their
address, serve torch clients, and stop cleanly on SIGTERM and SIGINT; a killed server makes
every client call fail fast with ``DistNetworkError``.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest
import torch.distributed as tdist
from tcp_support import StoreServer, ferrodist_store_command

import ferrodist
from ferrodist import _cli

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = [sys.executable, "-m", "ferrodist._cli"]


def _stops_cleanly(server: StoreServer, signum: int) -> None:
    client = tdist.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=10))
    client.set("k", "v")
    assert client.get("k") == b"v"
    server.proc.send_signal(signum)
    _, err = server.proc.communicate(timeout=20)
    assert server.proc.returncode == 0, err
    assert "shutting down" in err
    assert signal.Signals(signum).name in err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_binary_serves_then_stops_cleanly_on(signum: int) -> None:
    _stops_cleanly(StoreServer(command=ferrodist_store_command()), signum)


def test_console_script_serves_then_stops_cleanly_on_sigint() -> None:
    # SIGINT is the harder case for a Python process (its own handler would raise
    # KeyboardInterrupt); one run suffices since the server code is the binary's.
    _stops_cleanly(StoreServer(command=CONSOLE_SCRIPT), signal.SIGINT)


def test_the_wheel_installs_the_console_script() -> None:
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    entry = re.search(r'^ferrodist-store\s*=\s*"([^"]+)"', section, re.MULTILINE)
    assert entry, section
    module, _, function = entry.group(1).partition(":")
    assert (module, function) == ("ferrodist._cli", "main")
    assert getattr(_cli, function) is _cli.main


def test_console_script_rejects_bad_arguments() -> None:
    assert _cli.main(["ferrodist-store", "--port", "not-a-port"]) == 2


def test_world_size_is_reported_when_every_client_joined() -> None:
    server = StoreServer("--world-size", "2", command=ferrodist_store_command())
    try:
        stores = [
            tdist.TCPStore("127.0.0.1", server.port, world_size=2, timeout=timedelta(seconds=10))
            for _ in range(2)
        ]
        assert stores[0].num_keys() == 1, "only the init/ counter"
        server.proc.send_signal(signal.SIGTERM)
        _, err = server.proc.communicate(timeout=20)
        assert "all clients joined" in err
    finally:
        server.stop()


def _calls(store: ferrodist.TCPStore) -> dict[str, Callable[[], Any]]:
    return {
        "set": lambda: store.set("k", "v"),
        "get": lambda: store.get("k"),
        "add": lambda: store.add("n", 1),
        "compare_set": lambda: store.compare_set("k", "v", "w"),
        "check": lambda: store.check(["k"]),
        "wait": lambda: store.wait(["k"]),
        "delete_key": lambda: store.delete_key("k"),
        "num_keys": lambda: store.num_keys(),
        "append": lambda: store.append("k", "x"),
        "multi_get": lambda: store.multi_get(["k"]),
        "multi_set": lambda: store.multi_set(["k"], ["v"]),
        "queue_push": lambda: store.queue_push("q", "v"),
        "queue_pop": lambda: store.queue_pop("q"),
        "queue_len": lambda: store.queue_len("q"),
        "list_keys": lambda: store.list_keys(),
        "barrier": lambda: store.barrier("b", 2),
    }


def test_a_killed_server_fails_every_call_fast_with_dist_network_error() -> None:
    server = StoreServer(command=ferrodist_store_command())
    store = ferrodist.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=60))
    waiter = ferrodist.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=60))
    store.set("k", "v")
    blocked: list[BaseException] = []

    def blocked_get() -> None:
        try:
            waiter.get("never")
        except BaseException as err:
            blocked.append(err)

    thread = threading.Thread(target=blocked_get)
    thread.start()
    time.sleep(0.2)
    server.proc.kill()
    server.proc.communicate(timeout=10)
    started = time.monotonic()
    thread.join(timeout=10)
    assert len(blocked) == 1 and isinstance(blocked[0], tdist.DistNetworkError), blocked
    for name, call in _calls(store).items():
        with pytest.raises(tdist.DistNetworkError):
            call()
        assert time.monotonic() - started < 10, f"{name} was slow to fail"


def test_a_hung_server_fails_calls_at_the_store_timeout_instead_of_hanging() -> None:
    # torch's client has no receive timeout: a stopped server hangs its set/add/get forever.
    server = StoreServer(command=ferrodist_store_command())
    try:
        store = ferrodist.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=1))
        store.set("k", "v")
        server.proc.send_signal(signal.SIGSTOP)
        stat = Path(f"/proc/{server.proc.pid}/stat")
        while stat.read_text().split(")")[1].split()[0] != "T":
            time.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(tdist.DistNetworkError, match="no reply"):
            store.add("n", 1)
        assert 0.9 < time.monotonic() - started < 5
        server.proc.send_signal(signal.SIGCONT)
        assert store.get("k") == b"v", "the next call reconnects"
    finally:
        server.proc.send_signal(signal.SIGCONT)
        server.stop()
