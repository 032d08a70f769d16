"""TCPStore side by side: ferrodist's server and client against torch's libuv server and client.

One run measures, each against the baseline of torch's own client driving torch's libuv server:

1. single-client ops/s with p50 and p99 latency for set, get, add, check and wait (small values)
   and for set and get of 1 MiB values, plus the server's CPU time per op (from /proc/PID/stat),
   for three pairs: torch client -> torch libuv server (baseline), ferrodist client -> ferrodist
   server, and torch's stock client -> ferrodist server. The pairs take turns, round by round
   (ROUNDS), and ops/s is the median round, so a busy moment on a shared machine hits all three;
2. the rendezvous storm: N concurrent clients from one Rust load generator (benches/storm.rs)
   aimed at each server in turn (connect, handshake, add a counter, wait for a key the last
   arrival sets, get it), with wall time, server CPU time and server RSS per connection. A third
   server, benches/storm_floor.rs, answers the same storm with nothing but the syscalls it needs,
   so its CPU is the kernel's share, the floor under any server. The servers take turns over
   STORM_ROUNDS rounds and each row is the round with median CPU;
3. the DNS case: torch's servers reverse-resolve every accepted peer on the server thread, so a
   resolver that loses replies stalls everyone. The storm runs with the machine's resolver
   ("DNS on") and with a resolver that refuses at once ("DNS off", a private mount namespace
   whose /etc/resolv.conf points at a closed local port; needs root and `unshare`).

Servers run in their own processes, so their CPU time and memory are read from /proc alone.
Run: ``./scripts/bench benches/bench_tcp_store.py [--quick]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1 << 20
# benches/storm_floor.rs: the least a server can do to answer the storm (see its module doc).
KERNEL_FLOOR = "kernel floor"
# Storm rounds per size; the kinds take turns and each figure is the median round.
STORM_ROUNDS = 3

TORCH_SERVER = """
import sys
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=600),
                      wait_for_workers=False, use_libuv=sys.argv[1] == "libuv")
print("listening on 127.0.0.1:%d" % store.port, flush=True)
sys.stdin.read()
"""


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass
class Server:
    """A store server in its own process, measured through /proc."""

    name: str
    proc: subprocess.Popen[str]
    port: int

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime, all threads

    def rss_bytes(self) -> int:
        return int(Path(f"/proc/{self.proc.pid}/statm").read_text().split()[1]) * PAGE

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _dns_off_prefix() -> list[str] | None:
    """A command prefix that runs the server with a resolver that fails at once, if we can."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    resolv = Path(tempfile.gettempdir()) / "ferrodist-bench-resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount --bind {resolv} /etc/resolv.conf"],
        capture_output=True,
    )
    if probe.returncode != 0:
        return None
    script = f'mount --bind {resolv} /etc/resolv.conf && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, "sh"]


def start_server(kind: str, dns_off: bool) -> Server:
    if kind == "ferrodist":
        binary = shutil.which("ferrodist-store") or str(REPO / "target/release/ferrodist-store")
        cmd = [binary, "--host", "127.0.0.1", "--port", "0"]
    elif kind == KERNEL_FLOOR:
        cmd = [bench_binary("storm_floor"), "--port", "0"]
    else:
        cmd = [sys.executable, "-c", TORCH_SERVER, kind.removeprefix("torch-")]
    if dns_off:
        prefix = _dns_off_prefix()
        if prefix is None:
            raise RuntimeError("DNS off needs root and unshare")
        cmd = prefix + cmd
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=_raise_fd_limit,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        match = re.search(r":(\d+)\s*$", line.strip())
        if match:
            return Server(kind, proc, int(match.group(1)))
    proc.kill()
    raise RuntimeError(f"{kind} server did not print its address")


def torch_client(port: int) -> Any:
    import torch.distributed as dist

    return dist.TCPStore(
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60)
    )


def ferrodist_client(port: int) -> Any:
    import ferrodist

    return ferrodist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60)
    )


# --- single-client ops ---------------------------------------------------------------------


@dataclass
class OpResult:
    ops_per_s: float
    p50_us: float
    p99_us: float
    server_cpu_us_per_op: float


ROUNDS = 7
"""Each op is timed in this many rounds, the setups taking turns within a round, so that all of
them see the same moments of a shared, noisy machine; ops/s is the median round."""

REST_S = 0.2
"""Idle time before every round. On a virtual machine a thread that has kept its vCPU busy
loses scheduling credit on the host, and whoever runs next pays for it in wake-up latency
(measured here: a blocking client right after a spinning one saw 120 us round trips, the same
client after a rest 25 us). Resting first gives every setup the same starting state."""


@dataclass
class Setup:
    name: str
    server: Server
    store: Any


def _time_round(setup: Setup, op: Callable[[Any], object], n: int, lat: list[int]) -> float:
    """Runs `op` n times; appends latencies (ns) to `lat`; returns server CPU seconds used."""
    cpu0 = setup.server.cpu_s()
    for _ in range(n):
        t = time.perf_counter_ns()
        op(setup.store)
        lat.append(time.perf_counter_ns() - t)
    return setup.server.cpu_s() - cpu0


def single_client_ops(setups: list[Setup], n: int) -> dict[str, dict[str, OpResult]]:
    """Every op on every setup, interleaved round by round (see ROUNDS)."""
    small = b"v" * 32
    big = os.urandom(MIB)
    for setup in setups:
        setup.store.set("bench/k", small)
        setup.store.set("bench/big", big)
    ops: list[tuple[str, Callable[[Any], object], int]] = [
        ("set", lambda s: s.set("bench/k", small), n),
        ("get", lambda s: s.get("bench/k"), n),
        ("add", lambda s: s.add("bench/ctr", 1), n),
        ("check", lambda s: s.check(["bench/k"]), n),
        ("wait", lambda s: s.wait(["bench/k"]), n),
        ("set 1 MiB", lambda s: s.set("bench/big", big), max(n // 20, 50)),
        ("get 1 MiB", lambda s: s.get("bench/big"), max(n // 20, 50)),
    ]
    out: dict[str, dict[str, OpResult]] = {setup.name: {} for setup in setups}
    for name, op, count in ops:
        per_round = max(count // ROUNDS, 10)
        lat: dict[str, list[int]] = {setup.name: [] for setup in setups}
        rates: dict[str, list[float]] = {setup.name: [] for setup in setups}
        cpu: dict[str, float] = {setup.name: 0.0 for setup in setups}
        for setup in setups:  # warm up
            _time_round(setup, op, min(50, per_round), [])
        for _ in range(ROUNDS):
            for setup in setups:
                time.sleep(REST_S)
                start = time.perf_counter()
                cpu[setup.name] += _time_round(setup, op, per_round, lat[setup.name])
                rates[setup.name].append(per_round / (time.perf_counter() - start))
        for setup in setups:
            q = statistics.quantiles(lat[setup.name], n=100)
            out[setup.name][name] = OpResult(
                statistics.median(rates[setup.name]),
                q[49] / 1e3,
                q[98] / 1e3,
                cpu[setup.name] / (per_round * ROUNDS) * 1e6,
            )
    for setup in setups:
        assert setup.store.get("bench/big") == big and setup.store.get("bench/k") == small
    return out


# --- rendezvous storm ----------------------------------------------------------------------


@functools.cache
def bench_binary(name: str) -> str:
    """Builds one of benches/*.rs (release) once per run and returns its executable."""
    out = subprocess.run(
        ["cargo", "bench", "--bench", name, "--no-run", "--message-format=json", "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("target", {}).get("name") == name and msg.get("executable"):
            return str(msg["executable"])
    raise RuntimeError(f"cargo did not report the {name} executable")


@dataclass
class StormResult:
    clients: int
    wall_s: float
    failures: int
    server_cpu_s: float
    rss_per_conn: float
    slowest_s: float


def run_storm(binary: str, server: Server, clients: int, source_ips: int = 0) -> StormResult:
    rss0, cpu0 = server.rss_bytes(), server.cpu_s()
    cmd = [binary, "--addr", f"127.0.0.1:{server.port}", "--clients", str(clients)]
    cmd += ["--source-ips", str(source_ips), "--deadline-s", "150"]
    gen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert gen.stdout is not None and gen.stdin is not None
    result = json.loads(gen.stdout.readline())
    assert gen.stdout.readline().strip() == "HOLD"
    time.sleep(0.2)  # let the server finish writing its last replies
    rss1, cpu1 = server.rss_bytes(), server.cpu_s()
    gen.stdin.write("\n")
    gen.stdin.flush()
    gen.wait(60)
    return StormResult(
        clients,
        result["wall_s"],
        result["failures"],
        cpu1 - cpu0,
        (rss1 - rss0) / clients,
        result["slowest_client_s"],
    )


def storm_rounds(
    binary: str, kinds: list[str], clients: int, dns_off: bool, rounds: int
) -> list[tuple[str, StormResult]]:
    """Each kind storms `rounds` times, taking turns; per kind, the round with median CPU."""
    by_kind: dict[str, list[StormResult]] = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind in kinds:
            server = start_server(kind, dns_off)
            try:
                by_kind[kind].append(run_storm(binary, server, clients))
            finally:
                server.stop()
    return [
        (kind, sorted(runs, key=lambda r: r.server_cpu_s)[len(runs) // 2])
        for kind, runs in by_kind.items()
    ]


# --- report --------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def print_ops_table(rows: dict[str, dict[str, OpResult] | None]) -> None:
    base = rows["torch client -> torch libuv"]
    assert base is not None
    print("\n### Single client, ops/s (p50 / p99 latency in us), ratio = ops/s vs torch\n")
    names = list(rows)
    print("| op | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for op in base:
        cells = []
        for name in names:
            res = rows[name]
            if res is None:
                cells.append("n/a")
                continue
            r = res[op]
            ratio = "" if res is base else f" **{_ratio(r.ops_per_s, base[op].ops_per_s)}**"
            cells.append(f"{r.ops_per_s:,.0f} ({r.p50_us:.0f} / {r.p99_us:.0f}){ratio}")
        print(f"| {op} | " + " | ".join(cells) + " |")
    print("\nServer CPU per op (us), ratio vs torch:\n")
    print("| op | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for op in base:
        cells = []
        for name in names:
            res = rows[name]
            if res is None:
                cells.append("n/a")
                continue
            cpu = res[op].server_cpu_us_per_op
            ratio = "" if res is base else f" ({_ratio(cpu, base[op].server_cpu_us_per_op)})"
            cells.append(f"{cpu:.1f}{ratio}")
        print(f"| {op} | " + " | ".join(cells) + " |")


def print_storm_table(title: str, results: list[tuple[str, StormResult]]) -> None:
    print(f"\n### {title}\n")
    print(
        "| clients | server | wall s | server CPU s | server RSS / conn | failures | "
        "wall vs torch | CPU vs torch | RSS vs torch |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    base: dict[int, StormResult] = {}
    for name, r in results:
        if name.startswith("torch-libuv"):
            base[r.clients] = r
    for name, r in results:
        b = base.get(r.clients)
        ratios = ["", "", ""]
        if b is not None and not name.startswith("torch-libuv"):
            ratios = [
                _ratio(r.wall_s, b.wall_s),
                _ratio(r.server_cpu_s, b.server_cpu_s),
                _ratio(r.rss_per_conn, b.rss_per_conn),
            ]
        print(
            f"| {r.clients} | {name} | {r.wall_s:.3f} | {r.server_cpu_s:.2f} | "
            f"{r.rss_per_conn / 1024:.2f} KiB | {r.failures} | " + " | ".join(ratios) + " |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer ops, smaller storms")
    parser.add_argument("--skip", default="", help="comma list of: ops,storm,dns")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    n_ops = 500 if args.quick else 3000
    storm_sizes = [1024] if args.quick else [1024, 4096, 16384]
    dns_off = _dns_off_prefix() is not None
    have_ferrodist = _ferrodist_server_available()
    have_client = _ferrodist_client_available()
    print(f"machine: {os.cpu_count()} cores, shared; torch {_torch_version()}; DNS off: {dns_off}")

    if "ops" not in skip:
        pairs: list[tuple[str, str, Callable[[int], Any]]] = [
            ("torch client -> torch libuv", "torch-libuv", torch_client),
            ("ferrodist client -> ferrodist", "ferrodist", ferrodist_client),
            ("torch client -> ferrodist", "ferrodist", torch_client),
        ]
        servers: dict[str, Server] = {}
        setups: list[Setup] = []
        try:
            for name, kind, client in pairs:
                if (kind == "ferrodist" and not have_ferrodist) or (
                    client is ferrodist_client and not have_client
                ):
                    continue  # its row reads n/a
                if kind not in servers:
                    servers[kind] = start_server(kind, dns_off)
                setups.append(Setup(name, servers[kind], client(servers[kind].port)))
            measured = single_client_ops(setups, n_ops)
            rows: dict[str, dict[str, OpResult] | None] = {
                name: measured.get(name) for name, _, _ in pairs
            }
        finally:
            for server in servers.values():
                server.stop()
        print_ops_table(rows)

    binary = bench_binary("storm") if not {"storm", "dns"} <= skip else ""
    kinds = ["torch-libuv"] + (["ferrodist"] if have_ferrodist else [])
    if "storm" not in skip:
        rounds = 1 if args.quick else STORM_ROUNDS
        results = []
        for clients in storm_sizes:
            results += storm_rounds(binary, [*kinds, KERNEL_FLOOR], clients, dns_off, rounds)
        dns_note = "DNS off" if dns_off else "machine's resolver"
        title = f"Rendezvous storm ({dns_note}), median of {rounds} rounds"
        print_storm_table(title, results)

    if "dns" not in skip:
        results = []
        for kind in ["torch-libuv", "torch-legacy", *kinds[1:]]:
            server = start_server(kind, dns_off=False)
            try:
                results.append((kind, run_storm(binary, server, 256, source_ips=64)))
            finally:
                server.stop()
        print_storm_table("DNS on: 256 clients from 127.0.0.2-65, machine's resolver", results)


def _ferrodist_server_available() -> bool:
    binary = shutil.which("ferrodist-store") or REPO / "target/release/ferrodist-store"
    return Path(binary).exists()


def _ferrodist_client_available() -> bool:
    try:
        import ferrodist
    except ImportError:
        return False
    return hasattr(ferrodist, "TCPStore")


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


if __name__ == "__main__":
    main()
