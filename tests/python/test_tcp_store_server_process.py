"""The standalone server as a process: the binary starts in milliseconds with a few MB of RSS,
prints its address, serves torch clients, and stops cleanly on SIGTERM and SIGINT, even one sent
before its handlers exist; a closed stdout ends nothing; logs are plain text off a terminal or
JSON on request; a killed server makes every client call fail fast with ``DistNetworkError``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest
import torch.distributed as tdist
from tcp_support import StoreServer, ferrodist_store_command

import ferrodist

pytestmark = pytest.mark.timeout(90)


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


def test_the_server_on_path_is_a_native_binary_that_starts_small_and_fast() -> None:
    # The wheel ships the cargo binary itself: no Python launcher (which imported torch: 3-6 s
    # and ~500 MB before the first client).
    binary = ferrodist_store_command()[0]
    assert Path(binary).read_bytes()[:4] == b"\x7fELF", f"{binary} is not a native executable"
    started = time.monotonic()
    server = StoreServer(command=[binary])
    to_listening = time.monotonic() - started
    try:
        rss_kb = int(
            next(
                line.split()[1]
                for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:")
            )
        )
        # Typically 10-20 ms and 4 MB; the bounds leave room for a loaded machine.
        assert to_listening < 1.0, f"{to_listening:.3f} s to listening"
        assert rss_kb < 32 * 1024, f"{rss_kb} kB resident while idle"
    finally:
        server.stop()


def _block_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_sent_before_the_handlers_exist_stops_it_cleanly(signum: int) -> None:
    # The child starts with both signals blocked, so the signal sent at once is pending from
    # exec on, whatever the timing: the server must take it once its handlers exist (and not
    # leave it blocked, which would ignore it forever).
    proc = subprocess.Popen(
        [*ferrodist_store_command(), "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_block_stop_signals,
    )
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "shutting down" in err
    assert signal.Signals(signum).name in err


def test_help_into_a_closed_pipe_exits_cleanly() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*ferrodist_store_command(), "--help"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=20,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert "panic" not in done.stderr.lower(), done.stderr


def _closed_stdout_server(*args: str) -> tuple[subprocess.Popen[str], int]:
    """A server whose stdout is a pipe nobody reads (closed), and its port, from its log."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    proc = subprocess.Popen(
        [*ferrodist_store_command(), "--host", "127.0.0.1", "--port", "0", *args],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write_end)
    assert proc.stderr is not None
    first = proc.stderr.readline()
    return proc, int(json.loads(first)["fields"]["local_addr"].rsplit(":", 1)[1])


def test_json_logs_and_a_closed_stdout_keep_it_serving() -> None:
    proc, port = _closed_stdout_server("--log-format", "json")
    try:
        client = tdist.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=10))
        client.set("k", "v")
        assert client.get("k") == b"v"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        # Through the same reader as the first line: communicate() would skip what it buffered.
        assert proc.stderr is not None
        err = proc.stderr.read()
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in err.splitlines()]
    messages = [r["fields"]["message"] for r in records]
    assert any("could not print the address" in m for m in messages), messages
    assert messages[-1] == "shutting down", messages
    assert records[-1]["fields"]["signal"] == "SIGTERM"


def test_text_logs_have_no_colour_off_a_terminal() -> None:
    server = StoreServer(command=ferrodist_store_command())
    server.proc.send_signal(signal.SIGTERM)
    _, err = server.proc.communicate(timeout=20)
    assert "shutting down" in err
    assert "\x1b[" not in err, repr(err)


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
