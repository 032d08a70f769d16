"""What one small key costs the server: ``ferrodist-store`` against torch's libuv TCPStore server,
both real processes filled the same way by torch's own client, RSS read from ``/proc``.

A rendezvous keeps a key per rank, per barrier and per collective, so this is the server's
footprint. torch stores ``std::unordered_map<std::string, std::vector<uint8_t>>`` (124 B per
17-byte key with an 8-byte value when measured); ferrodist's map of two ``Bytes`` cost 216 B
until small entries became one allocation (``rust/store/entries.rs``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as tdist
from tcp_support import StoreServer

pytestmark = pytest.mark.timeout(240)

KEYS = 200_000
BATCH = 2_000

_TORCH_LIBUV_SERVER = r"""
import sys
from datetime import timedelta
import torch.distributed as d
s = d.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False,
               timeout=timedelta(seconds=60))
print(s.port, flush=True)
sys.stdin.read()
"""


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@contextmanager
def _torch_libuv_server() -> Iterator[tuple[int, int]]:
    """torch's libuv server alone in a helper process: (pid, port)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _TORCH_LIBUV_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"},
    )
    try:
        assert proc.stdout is not None
        yield proc.pid, int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.communicate(timeout=10)


def _bytes_per_key(pid: int, port: int, how: str) -> float:
    """Server RSS growth per key after KEYS 16-byte keys with 8-byte values (torch's client
    sends them as 17-byte keys: it prefixes ``/``), set one by one or BATCH per MULTI_SET."""
    client = tdist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    client.set("warm-up", "x")
    assert client.get("warm-up") == b"x"
    before = _rss_bytes(pid)
    if how == "set":
        for i in range(KEYS):
            client.set(f"key-{i:012d}", f"{i:08d}")
    else:
        for start in range(0, KEYS, BATCH):
            ids = range(start, start + BATCH)
            client.multi_set([f"key-{i:012d}" for i in ids], [f"{i:08d}" for i in ids])
    assert client.num_keys() >= KEYS  # a round trip behind every set: all are applied
    grown = _rss_bytes(pid) - before
    assert client.get(f"key-{KEYS - 1:012d}") == f"{KEYS - 1:08d}".encode()
    return grown / KEYS


@pytest.mark.parametrize("how", ["set", "multi_set"])
def test_a_small_key_costs_the_server_no_more_than_in_torchs(how: str) -> None:
    server = StoreServer()
    try:
        ours = _bytes_per_key(server.proc.pid, server.port, how)
    finally:
        server.stop()
    with _torch_libuv_server() as (pid, port):
        theirs = _bytes_per_key(pid, port, how)
    print(f"server RSS per key ({how}): ferrodist {ours:.0f} B, torch libuv {theirs:.0f} B")
    assert ours <= theirs, f"ferrodist {ours:.0f} B per key, torch {theirs:.0f} B"
