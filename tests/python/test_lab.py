"""The multi-host lab (benches/lab): real namespaces, real shaped links, real processes.

Two hosts reach each other only through their shaped link (a 50 MB TCP transfer at 1 Gbit/s
takes at least its bytes at link rate, less one TBF burst, and both ends' counters show it);
a 2-host gloo all_reduce works with GLOO_SOCKET_IFNAME set by the lab and its bytes go over
the lab link; a cut host (``Lab.cut``: its switch port down) is unreachable, sees no carrier
and keeps its TCP connections, which carry on after ``Lab.restore``; teardown leaves no
namespace or process behind, on exit, on an exception, on SIGTERM/SIGINT, and after the owner
is SIGKILLed and ``cleanup`` runs, while a live lab is never touched by ``cleanup``. Skips,
with the reason, where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _procs import default_sigint
from _procs import env as proc_env

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benches.lab import Lab, cleanup, lab_namespaces, leftover_labs, unavailable  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

MB = 1_000_000


@pytest.fixture(autouse=True)
def _needs_lab() -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with Lab(hosts=2, rate="1gbit") as lab:
        yield lab


def _env() -> dict[str, str]:
    env = proc_env()
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env["PYTHONPATH"]
    return env


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


RECEIVER = """
import socket, sys
srv = socket.create_server((sys.argv[1], 5001))
print("listening", flush=True)
conn, _ = srv.accept()
got = 0
while chunk := conn.recv(1 << 20):
    got += len(chunk)
conn.sendall(got.to_bytes(8, "big"))
conn.close()
"""

SENDER = """
import socket, sys, time
size, block = int(sys.argv[2]), b"x" * (1 << 20)
start = time.perf_counter()
s = socket.create_connection((sys.argv[1], 5001), timeout=30)
sent = 0
while sent < size:
    sent += s.send(block[: min(len(block), size - sent)])
s.shutdown(socket.SHUT_WR)
got = int.from_bytes(s.recv(8), "big")
print(got, time.perf_counter() - start)
"""


def test_hosts_reach_each_other_only_through_the_shaped_link(lab: Lab) -> None:
    size = 50 * MB
    for host in range(2):
        routes = json.loads(
            subprocess.run(
                ["ip", "-n", lab.namespaces[host], "-j", "-4", "route"],
                capture_output=True,
                text=True,
                check=True,
                timeout=10,
            ).stdout
        )
        assert [r["dst"] for r in routes] == [str(lab.subnet)], routes
    before = lab.counters()
    receiver = lab.popen(
        1,
        [sys.executable, "-c", textwrap.dedent(RECEIVER), lab.address(1)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert receiver.stdout is not None
    assert receiver.stdout.readline().strip() == "listening"
    sender = lab.popen(
        0,
        [sys.executable, "-c", textwrap.dedent(SENDER), lab.address(1), str(size)],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = sender.communicate(timeout=60)
    receiver.wait(timeout=10)
    got, elapsed = out.split()
    assert int(got) == size
    after = lab.counters()
    floor = (size - lab.burst) * 8 / lab.rate_bps
    assert float(elapsed) >= floor, f"{size} B in {float(elapsed):.3f} s beats the link"
    assert float(elapsed) < 20 * floor
    sent = after[0][0] - before[0][0]
    received = after[1][1] - before[1][1]
    assert size <= sent < size * 1.1, sent
    assert size <= received < size * 1.1, received


def test_an_unshaped_lab_is_faster_than_the_shaped_one() -> None:
    """The shaping is what limits the transfer above, not the machine."""
    size = 50 * MB
    with Lab(hosts=2, rate="unshaped") as lab:
        receiver = lab.popen(
            1,
            [sys.executable, "-c", textwrap.dedent(RECEIVER), lab.address(1)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert receiver.stdout is not None
        receiver.stdout.readline()
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                lab.namespaces[0],
                sys.executable,
                "-c",
                textwrap.dedent(SENDER),
                lab.address(1),
                str(size),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        receiver.wait(timeout=10)
    assert float(out.split()[1]) < size * 8 / 1e9


ALL_REDUCE = """
import os, sys, importlib, torch
dist = importlib.import_module(sys.argv[1])
from benches.lab import local_bytes
dist.init_process_group("gloo")
before = local_bytes()[0]
t = torch.full((1_000_000,), float(dist.get_rank() + 1))
dist.all_reduce(t)
sent = local_bytes()[0] - before
assert torch.equal(t, torch.full_like(t, 3.0)), t[:4]
print("ok", dist.get_rank(), dist.get_world_size(), os.environ["GLOO_SOCKET_IFNAME"], sent)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("module", ["torch.distributed", "ferrodist"])
def test_a_two_host_gloo_all_reduce_runs_over_the_lab_link(lab: Lab, module: str) -> None:
    results = lab.launch(
        [sys.executable, "-c", textwrap.dedent(ALL_REDUCE), module], env=_env(), timeout=60
    )
    for r in results:
        assert r.returncode == 0 and not r.timed_out, r.output
        word, rank, world, ifname, sent = r.output.split()[-5:]
        assert (word, int(rank), int(world), ifname) == ("ok", r.rank, 2, "lab0")
        # a 4 MB all_reduce at world 2 puts at least half the tensor on the wire per rank
        assert int(sent) >= 2 * MB, r.output


def test_a_failing_rank_ends_the_launch_early(lab: Lab) -> None:
    code = "import os, time, sys\nif os.environ['RANK'] == '1': sys.exit(3)\ntime.sleep(60)"
    start = time.monotonic()
    results = lab.launch([sys.executable, "-c", code], timeout=60, failure_grace=1.0)
    assert time.monotonic() - start < 20
    assert results[1].returncode == 3 and not results[1].timed_out
    assert results[0].timed_out


ECHO_SERVER = """
import socket, sys
srv = socket.create_server((sys.argv[1], 5002))
print("listening", flush=True)
conn, _ = srv.accept()
while chunk := conn.recv(4096):
    conn.sendall(chunk)
"""

# One connection; per stdin line "WORD SECONDS": send WORD, wait that long for its echo.
ECHO_CLIENT = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5002), timeout=10)
print("connected", flush=True)
got = b""
for line in sys.stdin:
    word, wait = line.split()
    s.sendall(word.encode() + b"\\n")
    deadline = time.monotonic() + float(wait)
    while (word.encode() + b"\\n") not in got and time.monotonic() < deadline:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            got += s.recv(4096)
        except socket.timeout:
            pass
    print(("got " if (word.encode() + b"\\n") in got else "timeout ") + word, flush=True)
"""


def test_a_cut_host_is_unreachable_until_restored_and_its_connections_survive(lab: Lab) -> None:
    server = lab.popen(
        1,
        [sys.executable, "-c", textwrap.dedent(ECHO_SERVER), lab.address(1)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    assert server.stdout.readline().strip() == "listening"
    client = lab.popen(
        0,
        [sys.executable, "-c", textwrap.dedent(ECHO_CLIENT), lab.address(1)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdin is not None and client.stdout is not None

    def echo(word: str, wait: float) -> str:
        assert client.stdin is not None and client.stdout is not None
        client.stdin.write(f"{word} {wait}\n")
        client.stdin.flush()
        return client.stdout.readline().strip()

    try:
        assert client.stdout.readline().strip() == "connected"
        assert echo("before", 10) == "got before"
        lab.cut(1)
        try:
            assert echo("during", 1.5) == "timeout during"
            link = json.loads(
                subprocess.run(
                    ["ip", "-n", lab.namespaces[1], "-j", "link", "show", "dev", lab.ifname],
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=10,
                ).stdout
            )[0]
            assert "NO-CARRIER" in link["flags"], link  # the host sees its cable pulled
        finally:
            lab.restore(1)
        # the same connection carries on: TCP retransmits what the cut swallowed
        assert echo("after", 20) == "got after"
    finally:
        client.kill()
        server.kill()
        client.communicate(timeout=10)
        server.communicate(timeout=10)
    with pytest.raises(ValueError, match="not in this lab"):
        lab.cut(2)


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True)
    return {link["ifname"] for link in json.loads(out.stdout)}


def test_teardown_on_exit_and_on_error_leaves_nothing() -> None:
    links = _root_links()
    with pytest.raises(RuntimeError, match="boom"), Lab(hosts=3) as lab:
        sleeper = lab.popen(2, ["sleep", "300"])
        assert set(lab.namespaces) | {lab.switch} <= set(lab_namespaces())
        raise RuntimeError("boom")
    assert not [ns for ns in lab_namespaces() if ns.startswith(lab.name)]
    assert sleeper.poll() is not None
    assert _root_links() == links
    assert not Path(f"/run/ferrodist-lab/{lab.name}.lock").exists()


OWNER = """
import sys, time
from benches.lab import Lab
lab = Lab(hosts=2).__enter__()
proc = lab.popen(1, ["sleep", "300"])
print(lab.name, proc.pid, flush=True)
time.sleep(300)
"""


def _start_owner() -> tuple[subprocess.Popen[str], str, int]:
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(OWNER)],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=default_sigint,  # a background runner ignores SIGINT; a user's owner does not
    )
    assert owner.stdout is not None
    name, pid = owner.stdout.readline().split()
    return owner, name, int(pid)


def _of(name: str) -> list[str]:
    return [ns for ns in lab_namespaces() if ns.startswith(name + "-")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_owner_tears_the_lab_down(sig: signal.Signals) -> None:
    owner, name, sleeper = _start_owner()
    assert len(_of(name)) == 3
    owner.send_signal(sig)
    owner.wait(timeout=30)
    assert _of(name) == []
    assert _gone(sleeper)


def test_cleanup_removes_a_killed_runs_lab_and_spares_live_ones(lab: Lab) -> None:
    links = _root_links()
    owner, name, sleeper = _start_owner()
    owner.kill()
    owner.wait(timeout=10)
    assert len(_of(name)) == 3, "SIGKILL cannot run teardown: the namespaces stay"
    assert name in leftover_labs() and lab.name not in leftover_labs()
    out = subprocess.run(
        [sys.executable, "-m", "benches.lab", "cleanup"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=_env(),
        check=True,
    ).stdout
    assert f"removed {name}-h0" in out
    assert _of(name) == []
    deadline = time.monotonic() + 5
    while not _gone(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(sleeper)
    assert len(_of(lab.name)) == 3, "cleanup touched a live lab"
    assert not [ns for ns in cleanup() if ns.startswith(lab.name)]
    assert _root_links() == links
