"""A client that trickles one large CHECK frame: the server CPU it costs, ferrodist vs torch.

A CHECK (or WAIT, MULTI_GET, MULTI_SET) frame may carry 128 K keys. A slow or hostile client
can send it one key per write; a server that re-scans the incomplete frame from its start after
every read spends O(N^2) on it (ferrodist's did: 2.55 s of CPU for 20 K keys, 5.96 s for
40 K). The servers measured, each in its own process, take turns per size:

* ``ferrodist-store`` (the binary on PATH, from ``target/release``);
* torch's libuv server, hosted by ``torch.distributed.TCPStore(is_master=True)``.

For each it prints the server's CPU seconds (user + system, from /proc) for the whole frame.

    ./scripts/bench benches/bench_trickle.py [--keys 20000,40000] [--pause 0.0001]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time

CHECK = 5
VALIDATE = struct.pack("<BI", 0, 0x3C85F7CE)
TORCH_SERVER = """
import sys, time, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(f"port :{store.port}", flush=True)
time.sleep(3600)
"""


def start(kind: str) -> tuple[subprocess.Popen[str], int]:
    if kind == "ferrodist":
        binary = shutil.which("ferrodist-store") or "target/release/ferrodist-store"
        cmd = [binary, "--host", "127.0.0.1", "--port", "0", "--log-level", "error"]
    else:
        cmd = [sys.executable, "-c", TORCH_SERVER]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    match = re.search(r":(\d+)", proc.stdout.readline())
    assert match, f"{kind} server printed no port"
    return proc, int(match.group(1))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def trickle(kind: str, keys: int, pause: float) -> float:
    proc, port = start(kind)
    try:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(VALIDATE)
        time.sleep(0.2)
        before = cpu_seconds(proc.pid)
        sock.sendall(struct.pack("<BQ", CHECK, keys))
        for i in range(keys):
            key = f"/{i:015d}".encode()
            sock.sendall(struct.pack("<Q", len(key)) + key)
            time.sleep(pause)
        assert sock.recv(1) == b"\x01", "CHECK of absent keys answers NOT_READY (1)"
        return cpu_seconds(proc.pid) - before
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="20000,40000")
    parser.add_argument("--pause", type=float, default=0.0001, help="seconds between keys")
    args = parser.parse_args()
    print("| keys, one per write | torch server CPU | ferrodist server CPU | ratio |")
    print("|---|---|---|---|")
    for keys in (int(k) for k in args.keys.split(",")):
        torch_cpu = trickle("torch", keys, args.pause)
        ours = trickle("ferrodist", keys, args.pause)
        ratio = ours / max(torch_cpu, 0.01)
        print(f"| {keys:,} | {torch_cpu:.2f} s | {ours:.2f} s | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
