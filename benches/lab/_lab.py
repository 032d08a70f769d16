"""``Lab``: N hosts as network namespaces on a bridge, each host's link shaped to a rate.

Topology: a switch namespace holds a bridge ``br0``; each host is a namespace whose interface
``lab0`` is one end of a veth pair whose other end (``p<i>``) is a port of that bridge. Both
ends are shaped with TBF (the kernel here has TBF and HTB but no netem): ``lab0``'s egress is
the host's upload, ``p<i>``'s egress its download. Nothing is made in the root namespace, so
interface names never collide between labs, only namespace names must, and those carry the
owner's pid and random hex. Addresses come from a 10.x.y.0/24 that no root route covers; they
exist only inside the lab's namespaces. ``lo`` is up in every host, IPv6 is off on the lab
links so the byte counters see only what the ranks send.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import random
import signal
import subprocess
import threading
from collections.abc import Sequence
from types import FrameType, TracebackType
from typing import IO, Any, Optional, Union

from . import _launch
from ._cleanup import hold_lock, lock_path
from ._ip import LabError, link_stats, new_name, remove_namespace, root_routes, run
from ._launch import RankResult

IFNAME = "lab0"
#: Named rates; a number is bits/s. ``unshaped`` (or 0 / None): no qdisc, veth speed.
RATES = {"1gbit": 1e9, "10gbit": 1e10, "unshaped": 0.0, "none": 0.0}
#: TBF's bucket: at least 512 KiB (what 1 Gbit/s was checked with), else 4 ms at the rate.
MIN_BURST_BYTES = 512 * 1024
DEFAULT_PORT = 29500


def parse_rate(rate: Union[str, float, None]) -> float:
    """Bits/s from ``"1gbit"``, ``"10gbit"``, ``"250mbit"``, ``"unshaped"``, a number or None."""
    if rate is None:
        return 0.0
    if isinstance(rate, (int, float)):
        return float(rate)
    key = rate.strip().lower()
    if key in RATES:
        return RATES[key]
    for suffix, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if key.endswith(suffix):
            return float(key[: -len(suffix)]) * scale
    raise ValueError(f"unknown rate {rate!r}: use e.g. '1gbit', '10gbit', '250mbit', 'unshaped'")


def _free_subnet() -> ipaddress.IPv4Network:
    taken = []
    for dst in root_routes():
        try:
            taken.append(ipaddress.ip_network(dst, strict=False))
        except ValueError:
            continue  # "default" and the like
    rng = random.Random()
    for _ in range(1000):
        net = ipaddress.IPv4Network(f"10.{rng.randrange(100, 255)}.{rng.randrange(256)}.0/24")
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return net
    raise LabError("no free 10.x.y.0/24 for the lab: every one tried overlaps a route")


class Lab:
    """A lab of ``hosts`` namespaces, each link shaped to ``rate`` (see ``parse_rate``).

    Use as a context manager (or call ``start()`` and ``close()``): everything it made is
    removed on exit, on an exception, on SIGTERM/SIGHUP (turned into ``SystemExit`` while the
    lab is open, in the main thread), on Ctrl-C, and at interpreter exit as a backstop.
    """

    def __init__(
        self, hosts: int = 2, rate: Union[str, float, None] = "1gbit", *, burst: int = 0
    ) -> None:
        if hosts < 1:
            raise ValueError("a lab needs at least one host")
        self.hosts = hosts
        self.rate_bps = parse_rate(rate)
        self.burst = burst or max(MIN_BURST_BYTES, int(self.rate_bps / 8 * 0.004))
        self.name = new_name()
        self.switch = f"{self.name}-sw"
        self.namespaces = [f"{self.name}-h{i}" for i in range(hosts)]
        self.ifname = IFNAME
        self.subnet: Optional[ipaddress.IPv4Network] = None
        self._lock: Optional[IO[bytes]] = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._old_handlers: dict[int, Any] = {}
        self._launches = 0

    # --- life cycle -------------------------------------------------------------------
    def __enter__(self) -> Lab:
        self._install_signal_handlers()
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def start(self) -> None:
        """Builds the lab; on any failure removes what was built and raises ``LabError``."""
        self._lock = hold_lock(self.name)
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        self.subnet = _free_subnet()
        sw = self.switch
        run("ip", "netns", "add", sw)
        run("ip", "-n", sw, "link", "set", "lo", "up")
        run("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", sw, "link", "set", "br0", "up")
        for i, ns in enumerate(self.namespaces):
            run("ip", "netns", "add", ns)
            run("ip", "-n", ns, "link", "set", "lo", "up")
            for key in ("all", "default"):
                run(
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "sysctl",
                    "-qw",
                    f"net.ipv6.conf.{key}.disable_ipv6=1",
                    check=False,
                )
            port = f"p{i}"
            run(
                "ip",
                "-n",
                sw,
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                IFNAME,
                "netns",
                ns,
            )
            run("ip", "-n", sw, "link", "set", port, "master", "br0", "up")
            run("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", IFNAME)
            run("ip", "-n", ns, "link", "set", IFNAME, "up")
            if self.rate_bps > 0:
                self._shape(ns, IFNAME)
                self._shape(sw, port)

    def _shape(self, ns: str, dev: str) -> None:
        run(
            "tc",
            "-n",
            ns,
            "qdisc",
            "add",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            f"{int(self.rate_bps)}bit",
            "burst",
            str(self.burst),
            "latency",
            "100ms",
        )

    def close(self) -> None:
        """Kills every process the lab started and removes its namespaces (idempotent)."""
        errors = []
        for proc in self._procs:
            _launch.kill_group(proc)
        self._procs.clear()
        if self._lock is not None:
            for ns in [*self.namespaces, self.switch]:
                try:
                    remove_namespace(ns)
                except LabError as e:
                    errors.append(str(e))
            lock_path(self.name).unlink(missing_ok=True)
            self._lock.close()
            self._lock = None
            atexit.unregister(self.close)
        self._restore_signal_handlers()
        if errors:
            raise LabError("; ".join(errors))

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: Optional[FrameType]) -> None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            current = signal.getsignal(sig)
            if sig == signal.SIGINT and current is not signal.SIG_DFL:
                continue  # Python's own handler already raises KeyboardInterrupt
            self._old_handlers[sig] = current
            signal.signal(sig, handler)

    def _restore_signal_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    # --- faults ------------------------------------------------------------------------
    def cut(self, host: int) -> None:
        """Cuts host ``host``'s cable: its switch port goes down, so the host sees no carrier
        and every packet to or from it is dropped. Nothing is reset: its processes and their
        TCP connections live on, sending into the void, as behind a pulled cable or a dead
        switch port (``restore`` plugs it back in; established connections then resume)."""
        self._check_host(host)
        run("ip", "-n", self.switch, "link", "set", f"p{host}", "down")

    def restore(self, host: int) -> None:
        """Undoes ``cut(host)``: the switch port comes back up (the bridge forwards at once)."""
        self._check_host(host)
        run("ip", "-n", self.switch, "link", "set", f"p{host}", "up")

    def _check_host(self, host: int) -> None:
        if not 0 <= host < self.hosts:
            raise ValueError(f"host {host} is not in this lab of {self.hosts} hosts")

    # --- addresses and counters ---------------------------------------------------------
    def address(self, host: int) -> str:
        """Host ``host``'s address on the lab link."""
        assert self.subnet is not None, "the lab is not started"
        return str(self.subnet.network_address + host + 1)

    def counters(self) -> dict[int, tuple[int, int]]:
        """Per host: (bytes sent, bytes received) on its lab interface so far."""
        return {i: link_stats(ns, IFNAME) for i, ns in enumerate(self.namespaces)}

    # --- processes ----------------------------------------------------------------------
    def popen(self, host: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Starts ``argv`` in host ``host`` (killed at ``close()`` if still running)."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.namespaces[host], *argv],
            start_new_session=True,
            **kwargs,
        )
        self._procs.append(proc)
        return proc

    def rank_env(
        self,
        rank: int,
        host: int,
        local_rank: int,
        ranks_per_host: int,
        port: int,
        base: Optional[dict[str, str]] = None,
    ) -> dict[str, str]:
        """The environment of one rank: torch's env:// variables plus the lab's own."""
        env = dict(os.environ if base is None else base)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(self.hosts * ranks_per_host),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(ranks_per_host),
            GROUP_RANK=str(host),
            MASTER_ADDR=self.address(0),
            MASTER_PORT=str(port),
            GLOO_SOCKET_IFNAME=IFNAME,
            TP_SOCKET_IFNAME=IFNAME,
            LAB_NAME=self.name,
            LAB_HOST=str(host),
            LAB_IFNAME=IFNAME,
            LAB_RATE_BPS=str(self.rate_bps),
        )
        return env

    def launch(
        self,
        argv: Sequence[str],
        *,
        ranks_per_host: int = 1,
        env: Optional[dict[str, str]] = None,
        timeout: float = 120.0,
        port: Optional[int] = None,
        failure_grace: float = _launch.FAILURE_GRACE_S,
    ) -> list[RankResult]:
        """Runs ``argv`` as ``hosts x ranks_per_host`` ranks (rank = host * ranks_per_host +
        local rank) and waits for all of them until ``timeout`` s, or ``failure_grace`` s
        after one fails (the others are killed then); results in rank order."""
        if port is None:
            port = DEFAULT_PORT + self._launches
        self._launches += 1
        started = []
        for host in range(self.hosts):
            for local in range(ranks_per_host):
                rank = host * ranks_per_host + local
                rank_env = self.rank_env(rank, host, local, ranks_per_host, port, env)
                proc, out = _launch.start(self.namespaces[host], argv, rank_env)
                self._procs.append(proc)
                started.append((rank, host, proc, out))
        killed = _launch.wait_all([p for _, _, p, _ in started], timeout, failure_grace)
        results = [
            RankResult(rank, host, int(proc.returncode), _launch.read_output(out), dead)
            for (rank, host, proc, out), dead in zip(started, killed)
        ]
        for _, _, proc, _ in started:
            self._procs.remove(proc)
        return results
