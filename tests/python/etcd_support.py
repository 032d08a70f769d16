"""A real etcd cluster for the tests: members on free loopback ports, killed and restarted.

Uses the ``etcd`` binary on PATH (Debian's ``etcd-server``; ``scripts/_setup.sh`` installs it).
Data directories go to ``/dev/shm`` where it exists: etcd fsyncs every write, and a tmpfs keeps
that from costing the shared test machine seconds per test. A member killed with SIGKILL
still loses nothing it acknowledged: its writes were in the kernel's page cache.

Elections are fast (50 ms heartbeats, 500 ms election timeout), so a fault test sees a new leader
within a second.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

READY_TIMEOUT_S = 30.0


def etcd_binary() -> str:
    binary = shutil.which("etcd")
    if binary is None:
        raise RuntimeError(
            "the etcd tests need `etcd` on PATH (Debian: apt-get install etcd-server; "
            "scripts/_setup.sh installs it)"
        )
    return binary


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    process: Optional[subprocess.Popen[bytes]] = None
    log: Optional[Path] = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"


@dataclass
class Tls:
    """PEM files for a cluster that serves clients over TLS and asks for client certificates."""

    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls(directory: Path) -> Tls:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate (openssl)."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=ferrodist-test-ca")  # fmt: skip
    for name, usage, san in (
        ("server", "serverAuth", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"),
        ("client", "clientAuth", ""),
    ):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", "-subj", f"/CN=ferrodist-test-{name}")  # fmt: skip
        (directory / f"{name}.ext").write_text(
            f"{san}extendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n"
        )
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
                "-extfile", f"{name}.ext")  # fmt: skip
    d = directory
    return Tls(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key")


@dataclass
class EtcdCluster:
    """``size`` members; ``endpoints`` is the comma-separated list a client takes."""

    size: int = 3
    tls: Optional[Tls] = None
    root: Path = field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix="etcd-", dir=_fast_dir()))
    )
    members: list[Member] = field(default_factory=list)

    def __post_init__(self) -> None:
        ports = _free_ports(2 * self.size)
        for i in range(self.size):
            self.members.append(
                Member(f"m{i}", ports[2 * i], ports[2 * i + 1], self.root / f"m{i}")
            )

    @property
    def endpoints(self) -> str:
        return ",".join(m.endpoint for m in self.members)

    def endpoint_list(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def _initial_cluster(self) -> str:
        return ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)

    def start_member(self, i: int) -> None:
        m = self.members[i]
        m.log = self.root / f"{m.name}.log"
        scheme = "https" if self.tls else "http"
        client = f"{scheme}://127.0.0.1:{m.client_port}"
        peer = f"http://127.0.0.1:{m.peer_port}"
        command = [
            etcd_binary(),
            "--name", m.name,
            "--data-dir", str(m.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self._initial_cluster(),
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self.root.name,
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
            "--logger", "zap",
            "--log-level", "error",
        ]  # fmt: skip
        if self.tls is not None:
            command += [
                "--cert-file", str(self.tls.server_cert),
                "--key-file", str(self.tls.server_key),
                "--trusted-ca-file", str(self.tls.ca_file),
                "--client-cert-auth",
            ]  # fmt: skip
        with open(m.log, "ab") as log:
            m.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def start(self) -> EtcdCluster:
        for i in range(self.size):
            self.start_member(i)
        self.wait_ready()
        return self

    def wait_ready(self, members: Optional[list[int]] = None) -> None:
        """Until every named (default: running) member answers and the cluster has a leader."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        names = members if members is not None else self.running()
        while time.monotonic() < deadline:
            if all(self._healthy(i) for i in names):
                return
            for i in names:
                process = self.members[i].process
                if process is not None and process.poll() is not None:
                    raise RuntimeError(f"etcd member {i} exited: {self.log_tail(i)}")
            time.sleep(0.05)
        raise RuntimeError(f"etcd cluster not ready in {READY_TIMEOUT_S}s: {self.log_tail(0)}")

    def _healthy(self, i: int) -> bool:
        import ssl
        import urllib.request

        context = None
        if self.tls is not None:
            context = ssl.create_default_context(cafile=str(self.tls.ca_file))
            context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        scheme = "https" if self.tls else "http"
        url = f"{scheme}://{self.members[i].endpoint}/health"
        try:
            with urllib.request.urlopen(url, timeout=1, context=context) as reply:
                return b'"true"' in reply.read()
        except OSError:
            return False

    def running(self) -> list[int]:
        return [
            i
            for i, m in enumerate(self.members)
            if m.process is not None and m.process.poll() is None
        ]

    def leader(self) -> int:
        """Index of the member that is leader now (asked over etcd's HTTP gateway)."""
        import json
        import urllib.request

        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for i in self.running():
                url = f"http://{self.members[i].endpoint}/v3/maintenance/status"
                try:
                    request = urllib.request.Request(url, data=b"{}", method="POST")
                    with urllib.request.urlopen(request, timeout=1) as reply:
                        status = json.loads(reply.read())
                except OSError:
                    continue
                if status.get("leader") and status["leader"] == status["header"]["member_id"]:
                    return i
            time.sleep(0.05)
        raise RuntimeError("no etcd leader")

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (no clean shutdown) and reap it."""
        process = self.members[i].process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)

    def restart(self, i: int) -> None:
        """Starts member ``i`` again on its data directory."""
        self.start_member(i)

    def log_tail(self, i: int) -> str:
        log = self.members[i].log
        return log.read_text(errors="replace")[-2000:] if log and log.exists() else ""

    def stop(self) -> None:
        for m in self.members:
            if m.process is not None and m.process.poll() is None:
                m.process.terminate()
        for m in self.members:
            if m.process is not None:
                try:
                    m.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    m.process.kill()
                    m.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _fast_dir() -> Optional[str]:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@contextmanager
def etcd_cluster(size: int = 3, tls: Optional[Tls] = None) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(size, tls=tls)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
