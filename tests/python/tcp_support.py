"""Helpers for the TCP store tests: real server processes and one script of store calls.

Servers always run in their own process: ``ferrodist-store`` (the Rust binary, on PATH from
``pip install`` or the scripts), or torch's own libuv and legacy servers in a helper Python
process. Every helper kills
what it started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Optional

import torch.distributed as tdist

READY_TIMEOUT_S = 60.0

_TORCH_SERVERS = r"""
import sys
import torch.distributed as d
from datetime import timedelta
count = int(sys.argv[1])
kinds = [True] * count + [False] * count
servers = [d.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=k, wait_for_workers=False,
                      timeout=timedelta(seconds=30)) for k in kinds]
print(" ".join(str(s.port) for s in servers), flush=True)
sys.stdin.read()
"""


def ferrodist_store_command() -> list[str]:
    """The ``ferrodist-store`` binary on PATH (``pip install .`` or ``cargo build --release``)."""
    binary = shutil.which("ferrodist-store")
    assert binary, "ferrodist-store is not on PATH: pip install . (or cargo build --release)"
    return [binary]


def _read_line(proc: subprocess.Popen[str], what: str) -> str:
    deadline = time.monotonic() + READY_TIMEOUT_S
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise RuntimeError(f"{what} exited before it was ready: {err}")
    assert time.monotonic() < deadline, f"{what} took too long to start"
    return line.strip()


class StoreServer:
    """A ``ferrodist-store`` process."""

    def __init__(self, *args: str, command: Optional[list[str]] = None) -> None:
        argv = [*(command or ferrodist_store_command()), "--host", "127.0.0.1", "--port", "0"]
        self.proc = subprocess.Popen(
            [*argv, "--log-level", "info", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = _read_line(self.proc, "ferrodist-store")
        assert line.startswith("ferrodist-store listening on "), line
        self.port = int(line.rsplit(":", 1)[1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)


@contextlib.contextmanager
def ferrodist_store(*args: str) -> Iterator[StoreServer]:
    """A running ``ferrodist-store`` on 127.0.0.1 and a free port."""
    server = StoreServer(*args)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def torch_servers(count: int) -> Iterator[tuple[list[int], list[int]]]:
    """``count`` torch libuv servers and ``count`` legacy ones, in one helper process."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _TORCH_SERVERS, str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"},
    )
    try:
        ports = [int(p) for p in _read_line(proc, "torch servers").split()]
        yield ports[:count], ports[count:]
    finally:
        proc.kill()
        proc.communicate(timeout=10)


def kind(err: BaseException) -> str:
    """The torch class a caller would catch ``err`` with."""
    for cls in (
        getattr(tdist, "QueueEmptyError", None),  # torch >= 2.8
        tdist.DistNetworkError,
        tdist.DistStoreError,
    ):
        if cls is not None and isinstance(err, cls):
            return cls.__name__
    return type(err).__name__


def torch_store_has(method: str) -> bool:
    """Whether the installed torch's Store API has ``method`` (list_keys, queues and barrier
    are newer than torch 2.4; barrier is 2.13's)."""
    return hasattr(tdist.Store, method)


def exercise(store: Any, queues: bool = True) -> list[Any]:
    """Runs every Store method of the installed torch once and records what came back (values
    and errors). Methods this torch lacks are skipped, so its own client can run it too."""
    out: list[Any] = []
    store.set("k", "v")
    out.append(store.get("k"))
    out += [store.add("n", 5), store.add("n", -2)]
    out.append(store.compare_set("k", "v", "w"))
    out.append(store.compare_set("k", "zz", "y"))
    out.append(store.compare_set("fresh", "x", "y"))
    out.append(store.compare_set("fresh2", "", "y"))
    out += [store.check(["k", "n"]), store.check(["absent"])]
    store.append("a", b"1")
    store.append("a", "2")
    out.append(store.get("a"))
    store.multi_set(["m1", "m2"], [b"x", "y"])
    out.append(store.multi_get(["m1", "m2"]))
    out.append(store.num_keys())
    if torch_store_has("list_keys"):
        out.append(sorted(store.list_keys()))
    out += [store.delete_key("k"), store.delete_key("k"), store.check(["k"])]
    out.append(store.has_extended_api())
    calls = [
        lambda: store.wait(["never"], timedelta(milliseconds=100)),
        lambda: store.wait(["n", "never", "never2"], timedelta(milliseconds=100)),
    ]
    barrier = torch_store_has("barrier")
    if barrier:
        calls.append(lambda: store.barrier("lonely", 2, timedelta(milliseconds=100)))
    for call in calls:
        try:
            call()
            out.append("no error")
        except Exception as err:
            out.append((kind(err), str(err)))
    if barrier:
        out.append(store.get("lonely"))
    store.set("after", "1")
    out.append(store.get("after"))
    store.wait(["after", "n"], timedelta(seconds=10))
    if barrier:
        store.barrier("solo", 1)
    store.set_timeout(timedelta(milliseconds=100))
    try:
        store.get("never3")
    except Exception as err:
        out.append((kind(err), "get", "never3" in str(err)))
    store.set_timeout(timedelta(seconds=10))
    out.append(store.timeout)
    if queues and torch_store_has("queue_push"):
        store.queue_push("q", "e1")
        store.queue_push("q", b"e2")
        out += [store.queue_len("q"), store.queue_pop("q"), store.queue_pop("q", False)]
        try:
            store.queue_pop("q", block=False)
        except Exception as err:
            out.append((kind(err), str(err)))
        out.append(store.queue_len("q"))
    return out
