"""Access control and metrics of the store server, against real processes and real clients.

``ferrodist-store --auth-token-file`` admits ferrodist clients holding the token (keyword, env
var or token file) and refuses the others with ``AuthenticationError`` at once; stock torch
clients are refused unless ``--allow-unauthenticated-torch-clients``; the token appears in no
log line and no error. ``--max-connections`` refuses beyond the cap and leaves admitted clients
alone. ``--metrics-addr`` serves Prometheus text scraped here with urllib, and a rank-0 hosted
store gives the same numbers through ``TCPStore.metrics()`` and ``metrics_addr``.
"""

from __future__ import annotations

import re
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as tdist
from tcp_support import StoreServer, ferrodist_store_command, torch_servers

import ferrodist
from ferrodist.errors import AuthenticationError

pytestmark = pytest.mark.timeout(120)

TOKEN = "tok-8c1f0e-do-not-print"
SHORT = timedelta(seconds=2)
LONG = timedelta(seconds=30)

_SAMPLE = re.compile(r"^(ferrodist_store_[a-z_]+(?:\{[a-z]+=\"[^\"]*\"\})?) (\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text page; each metric has its HELP and TYPE lines."""
    samples: dict[str, float] = {}
    described: set[str] = set()
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            described.add(line.split()[2])
        elif line.startswith("# TYPE "):
            typed.add(line.split()[2])
        else:
            match = _SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            samples[match.group(1)] = float(match.group(2))
    for name in samples:
        base = re.sub(r"(_bucket|_sum|_count)$", "", name.split("{")[0])
        assert base in described and base in typed, f"{name} lacks HELP/TYPE"
    return samples


def assert_torch_client_refused(port: int) -> None:
    """A stock torch client is closed on at its first request after torch's handshake (torch 2.4
    sends no PING: at its first request too), so its first reply never comes."""
    with pytest.raises(tdist.DistError):
        client = tdist.TCPStore("127.0.0.1", port, timeout=SHORT)
        client.set("refused", "1")
        client.get("refused")


def scrape(addr: str, path: str = "/metrics") -> tuple[int, str, str]:
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as response:
        return response.status, response.headers["Content-Type"], response.read().decode()


def eventually(what: str, cond: object) -> None:
    deadline = time.monotonic() + 10
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


class Server(StoreServer):
    """A ``ferrodist-store`` with metrics; its second stdout line gives their address."""

    def __init__(self, *args: str) -> None:
        # debug: every line the server can write about a connection, none with the token
        super().__init__("--metrics-addr", "127.0.0.1:0", "--log-level", "debug", *args)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line.startswith("ferrodist-store metrics on http://"), line
        self.metrics_addr = line.removeprefix("ferrodist-store metrics on http://").split("/")[0]

    def metrics(self) -> dict[str, float]:
        return parse_metrics(scrape(self.metrics_addr)[2])

    def stop_and_log(self) -> str:
        """Stops it with SIGTERM and returns everything it logged."""
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=20)
        assert self.proc.returncode == 0, err
        return err


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "store.token"
    path.write_text(f"  {TOKEN}\n")
    return path


def test_the_server_admits_token_holders_only_and_never_shows_the_token(
    token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = Server("--auth-token-file", str(token_file))
    try:
        store = ferrodist.TCPStore("127.0.0.1", server.port, timeout=LONG, auth_token=TOKEN)
        store.set("k", "v")
        assert store.get("k") == b"v"

        started = time.monotonic()
        with pytest.raises(AuthenticationError, match="authentication failed") as wrong:
            ferrodist.TCPStore("127.0.0.1", server.port, timeout=LONG, auth_token="guess")
        assert time.monotonic() - started < 5, "refused at once, not at the timeout"
        assert isinstance(wrong.value, tdist.DistStoreError)
        with pytest.raises(AuthenticationError, match="requires an auth token") as missing:
            ferrodist.TCPStore("127.0.0.1", server.port, timeout=LONG)
        for err in (wrong.value, missing.value):
            assert TOKEN not in str(err) and "guess" not in str(err)

        monkeypatch.setenv("FERRODIST_STORE_TOKEN", TOKEN)
        assert ferrodist.TCPStore("127.0.0.1", server.port, timeout=LONG).get("k") == b"v"
        monkeypatch.delenv("FERRODIST_STORE_TOKEN")
        monkeypatch.setenv("FERRODIST_STORE_TOKEN_FILE", str(token_file))
        assert ferrodist.TCPStore("127.0.0.1", server.port, timeout=LONG).get("k") == b"v"

        # A stock torch client cannot present the token: it is closed on.
        assert_torch_client_refused(server.port)
        metrics = server.metrics()
        assert metrics['ferrodist_store_connections_refused_total{reason="authentication"}'] == 2
        assert metrics['ferrodist_store_connections_refused_total{reason="torch_client"}'] >= 1
    finally:
        log = server.stop_and_log()
    assert TOKEN not in log and "guess" not in log
    refusals = [line for line in log.splitlines() if "refused connection" in line]
    assert any("authentication failed" in line for line in refusals), log
    assert any("stock torch client" in line for line in refusals), log
    assert all("peer=127.0.0.1:" in line for line in refusals), refusals


def test_stock_torch_clients_are_admitted_when_the_operator_allows_them(token_file: Path) -> None:
    server = Server("--auth-token-file", str(token_file), "--allow-unauthenticated-torch-clients")
    try:
        torch_client = tdist.TCPStore("127.0.0.1", server.port, timeout=LONG)
        torch_client.set("from-torch", "1")
        ours = ferrodist.TCPStore("127.0.0.1", server.port, timeout=LONG, auth_token=TOKEN)
        assert ours.get("from-torch") == b"1"
        ours.set("from-ferrodist", "2")
        assert torch_client.get("from-ferrodist") == b"2"
        with pytest.raises(AuthenticationError):
            ferrodist.TCPStore("127.0.0.1", server.port, timeout=LONG, auth_token="guess")
    finally:
        assert TOKEN not in server.stop_and_log()


def test_stock_torch_clients_are_served_only_from_the_networks_named(token_file: Path) -> None:
    # 127.0.0.1 is outside 10.99.0.0/16: a stock client from here is refused like any other,
    # and the start-up log says which networks skip the token.
    server = Server(
        "--auth-token-file",
        str(token_file),
        "--allow-unauthenticated-torch-clients",
        "--torch-clients-from",
        "10.99.0.0/16,fd00:99::/32",
    )
    try:
        assert_torch_client_refused(server.port)
        ours = ferrodist.TCPStore("127.0.0.1", server.port, timeout=LONG, auth_token=TOKEN)
        ours.set("k", "v")
        refused = 'ferrodist_store_connections_refused_total{reason="torch_client"}'
        eventually("the torch client is counted", lambda: server.metrics()[refused] >= 1)
    finally:
        log = server.stop_and_log()
    assert "10.99.0.0/16" in log and "served without it" in log, log
    assert TOKEN not in log


def test_the_help_says_what_stock_clients_may_do() -> None:
    done = subprocess.run(
        [*ferrodist_store_command(), "--help"], capture_output=True, text=True, timeout=30
    )
    text = " ".join(done.stdout.split())
    assert "only from loopback unless `--torch-clients-from`" in text, text
    assert "reads and writes every key" in text, text


@pytest.mark.parametrize("content", [None, "", " \n\t\n"])
def test_a_missing_or_empty_token_file_stops_the_start(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    done = subprocess.run(
        [*ferrodist_store_command(), "--port", "0", "--auth-token-file", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert str(path) in done.stderr
    assert ("empty" if content is not None else "cannot read") in done.stderr
    assert "listening" not in done.stdout


def test_a_client_holding_a_token_sends_nothing_to_servers_that_cannot_prove_it() -> None:
    # torch's servers, and ferrodist's without a token: none can prove the token, so a client
    # holding one refuses them at once (no downgrade to an unauthenticated store).
    plain = ferrodist.TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG)
    with torch_servers(1) as (libuv, legacy):
        for port in [*libuv, *legacy, plain.port]:
            started = time.monotonic()
            with pytest.raises(AuthenticationError, match="did not prove") as refused:
                ferrodist.TCPStore("127.0.0.1", port, timeout=LONG, auth_token=TOKEN)
            assert time.monotonic() - started < 5, "refused at once, not at the timeout"
            assert TOKEN not in str(refused.value)
            # The same server, without a token: used as before.
            store = ferrodist.TCPStore("127.0.0.1", port, timeout=LONG)
            store.set("k", "v")
            assert store.get("k") == b"v"
    plain._stop_server()


def test_the_torch_client_flag_needs_a_token_file() -> None:
    done = subprocess.run(
        [*ferrodist_store_command(), "--port", "0", "--allow-unauthenticated-torch-clients"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert "--auth-token-file" in done.stderr


def test_the_token_file_is_read_once_at_start(token_file: Path) -> None:
    server = Server("--auth-token-file", str(token_file))
    try:
        token_file.write_text("a-new-token\n")
        ferrodist.TCPStore("127.0.0.1", server.port, timeout=LONG, auth_token=TOKEN).set("k", "v")
        with pytest.raises(AuthenticationError):
            ferrodist.TCPStore("127.0.0.1", server.port, timeout=LONG, auth_token="a-new-token")
    finally:
        server.stop_and_log()


def test_beyond_max_connections_new_clients_are_refused_and_admitted_ones_carry_on() -> None:
    server = Server("--max-connections", "2")
    try:
        first = tdist.TCPStore("127.0.0.1", server.port, timeout=LONG)
        second = tdist.TCPStore("127.0.0.1", server.port, timeout=LONG)
        assert_torch_client_refused(server.port)
        first.set("a", "1")
        second.set("b", "2")
        assert first.get("b") == b"2" and second.get("a") == b"1"
        metrics = server.metrics()
        assert metrics['ferrodist_store_connections_refused_total{reason="max_connections"}'] >= 1
        assert metrics["ferrodist_store_open_connections"] == 2
    finally:
        log = server.stop_and_log()
    assert "--max-connections are open" in log


def test_metrics_scraped_over_http_move_with_real_traffic() -> None:
    server = Server()
    try:
        status, content_type, _ = scrape(server.metrics_addr)
        assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
        assert scrape(server.metrics_addr, "/healthz")[::2] == (200, "ok\n")
        with pytest.raises(urllib.error.HTTPError) as missing:
            scrape(server.metrics_addr, "/nothing")
        assert missing.value.code == 404
        before = server.metrics()

        client = tdist.TCPStore("127.0.0.1", server.port, timeout=LONG)
        client.set("a", "12345")
        client.set("b", "x")
        assert client.get("a") == b"12345"
        waiter = ferrodist.TCPStore("127.0.0.1", server.port, timeout=LONG)
        blocked = threading.Thread(target=_wait_quietly, args=(waiter,))
        blocked.start()
        eventually("a pending wait", lambda: server.metrics()["ferrodist_store_pending_waits"] == 1)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            raw.sendall(struct.pack("<BI", 0, 0x3C85F7CE) + b"\xee")  # VALIDATE, bad opcode
            assert raw.recv(1) == b""
        eventually(
            "the bad frame is counted",
            lambda: server.metrics()["ferrodist_store_rejected_frames_total"] == 1,
        )
        after = server.metrics()
        assert after["ferrodist_store_keys"] == before["ferrodist_store_keys"] + 2
        # torch's client prefixes keys with "/": "/a"+"12345" and "/b"+"x", plus "init/"...
        assert after["ferrodist_store_stored_bytes"] >= 2 + 5 + 2 + 1
        assert after['ferrodist_store_requests_total{opcode="set"}'] == 2
        assert after['ferrodist_store_requests_total{opcode="get"}'] >= 1
        assert after['ferrodist_store_requests_total{opcode="wait"}'] >= 2
        assert after["ferrodist_store_open_connections"] >= 2
        count = after["ferrodist_store_request_duration_seconds_count"]
        assert count == after['ferrodist_store_request_duration_seconds_bucket{le="+Inf"}']
        assert count >= 6
        blocked.join(timeout=30)
    finally:
        server.stop_and_log()


def _wait_quietly(store: ferrodist.TCPStore) -> None:
    with pytest.raises(tdist.DistStoreError):
        store.wait(["never"], timedelta(seconds=3))


def test_a_store_hosted_in_rank_0_reports_and_serves_the_same_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FERRODIST_STORE_METRICS_ADDR", "127.0.0.1:0")
    master = ferrodist.TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG)
    worker = ferrodist.TCPStore("127.0.0.1", master.port, timeout=LONG)
    worker.set("k", "v" * 100)
    assert worker.check(["k"])  # a reply on the same connection: the SET has been applied
    in_process = parse_metrics(master.metrics())
    assert in_process["ferrodist_store_keys"] == 1
    assert in_process["ferrodist_store_stored_bytes"] == len("/k") + 100
    assert master.metrics_addr is not None and worker.metrics_addr is None
    served = parse_metrics(scrape(master.metrics_addr)[2])
    assert served["ferrodist_store_keys"] == 1
    assert served['ferrodist_store_requests_total{opcode="set"}'] == 1
    assert served['ferrodist_store_requests_total{opcode="check"}'] == 1
    with pytest.raises(RuntimeError, match="does not host the server"):
        worker.metrics()
    master._stop_server()


def test_a_store_hosted_in_rank_0_requires_its_token() -> None:
    master = ferrodist.TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG, auth_token=TOKEN)
    ferrodist.TCPStore("127.0.0.1", master.port, timeout=LONG, auth_token=TOKEN).set("k", "v")
    assert master.get("k") == b"v"
    with pytest.raises(AuthenticationError):
        ferrodist.TCPStore("127.0.0.1", master.port, timeout=LONG, auth_token="guess")
    assert_torch_client_refused(master.port)
    lenient = ferrodist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        timeout=LONG,
        auth_token=TOKEN,
        allow_unauthenticated_torch_clients=True,
    )
    stock = tdist.TCPStore("127.0.0.1", lenient.port, timeout=LONG)
    stock.set("k", "torch")
    assert lenient.get("k") == b"torch"
    master._stop_server()
    lenient._stop_server()


@pytest.mark.parametrize(
    ("keyword", "value", "error"),
    [
        ("auth_token", 5, TypeError),
        ("metrics_addr", 80, TypeError),
        ("auth_token", " ", ValueError),
    ],
)
def test_bad_access_keywords_name_the_argument(keyword: str, value: object, error: type) -> None:
    with pytest.raises(error, match=keyword):
        ferrodist.TCPStore("127.0.0.1", 0, is_master=True, timeout=SHORT, **{keyword: value})


def test_a_blank_token_argument_is_refused_by_name_and_the_environment_is_read_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="argument 'auth_token' is empty"):
        ferrodist.TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG, auth_token="  \n")
    monkeypatch.setenv("FERRODIST_STORE_TOKEN", TOKEN)
    master = ferrodist.TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG)
    master.set("k", "v")
    monkeypatch.delenv("FERRODIST_STORE_TOKEN")
    with pytest.raises(AuthenticationError):  # the master took the environment's token
        ferrodist.TCPStore("127.0.0.1", master.port, timeout=LONG)
    assert (
        ferrodist.TCPStore("127.0.0.1", master.port, timeout=LONG, auth_token=TOKEN).get("k")
        == b"v"
    )
    master._stop_server()
