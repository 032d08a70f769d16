"""``python -m ferrodist.doctor --store``: real gloo jobs (``_flight_workers``) on a real
``ferrodist-store`` that wants a token, diagnosed from outside by the doctor as its own process,
while the job runs or hangs."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

from _procs import env, outputs_of
from tcp_support import ferrodist_store

import ferrodist

HERE = Path(__file__).resolve().parent
THRESHOLD_S = 1.0
GROUP_TIMEOUT_S = 60.0  # the stuck ranks wait this long at most; the test kills them first
TOKEN = secrets.token_hex(16)

_WORKER = (
    f"import sys; sys.path.insert(0, {str(HERE)!r}); import _flight_workers as w; "
    "w.main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), "
    "float(sys.argv[5]))"
)


def site(name: str) -> str:
    """``_flight_workers.py:LINE`` of the line marked ``# site: name``."""
    for number, line in enumerate((HERE / "_flight_workers.py").read_text().splitlines(), 1):
        if line.rstrip().endswith(f"# site: {name}"):
            return f"_flight_workers.py:{number}"
    raise AssertionError(name)


@contextlib.contextmanager
def job(scenario: str, world: int, tmp: Path, prefix: str) -> Iterator[tuple[int, list]]:
    """(store port, rank processes) of a ``world``-rank job on a ``ferrodist-store`` with
    ``TOKEN``, the ranks' store handed in under ``prefix``; every process is killed after."""
    token_file = tmp / "token"
    token_file.write_text(TOKEN)
    with ferrodist_store("--auth-token-file", str(token_file)) as server:
        ranks_env = {
            **env(),
            "FERRODIST_STORE_TOKEN": TOKEN,
            "FLIGHT_TEST_STORE_PREFIX": prefix,
            "FERRODIST_HANG_THRESHOLD_S": str(THRESHOLD_S),
            "FERRODIST_FLIGHT_DUMP_DIR": str(tmp),
        }
        args = [str(world), str(server.port), str(GROUP_TIMEOUT_S)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _WORKER, scenario, str(r), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=ranks_env,
            )
            for r in range(world)
        ]
        try:
            yield server.port, procs
        finally:
            for p in procs:
                p.kill()
            outputs_of(procs, timeout=10)


def doctor(*args: str, token: str = TOKEN) -> tuple[subprocess.CompletedProcess[str], float]:
    """The doctor run as its own process (the token in its environment only), and its time."""
    argv = [sys.executable, "-m", "ferrodist.doctor", *args]
    assert TOKEN not in " ".join(argv)
    started = time.monotonic()
    token_env = {**env(), "FERRODIST_STORE_TOKEN": token}
    done = subprocess.run(argv, capture_output=True, text=True, env=token_env, timeout=60)
    assert TOKEN not in done.stdout + done.stderr, done
    return done, time.monotonic() - started


def wait_until(what: str, ready, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def pending_in_store(port: int, prefix: str, ranks: list[int]) -> bool:
    """Whether each of ``ranks`` has published a summary with an op pending."""
    store = ferrodist.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=10), auth_token=TOKEN)
    keys = [f"{prefix}/ferrodist/flight/{r}" for r in ranks]
    if not store.check(keys):
        return False
    return all(json.loads(v).get("pending") for v in store.multi_get(keys))


def test_the_doctor_names_a_stopped_rank_from_the_store_while_the_job_hangs(tmp_path):
    with job("stopped", 3, tmp_path, prefix="job7") as (port, procs):
        # Rank 2 stops itself (SIGSTOP) after the warm-up; 0 and 1 then wait in an all_reduce.
        wait_until("stopped rank 2", lambda: stopped(procs[2].pid))
        wait_until("pending all_reduce", lambda: pending_in_store(port, "job7", [0, 1]))
        address = f"127.0.0.1:{port}"
        text, _ = doctor("--store", address, "--prefix", "job7")
        as_json, _ = doctor("--store", address, "--prefix", "job7", "--json")
        # the keys are under the job's prefix: without it the doctor says where it looked
        unprefixed, _ = doctor("--store", address)
        assert all(p.poll() is None for p in procs[:2]), "the job ended before the doctor ran"
        procs[2].send_signal(signal.SIGCONT)
    assert text.returncode == 0, text.stderr
    assert re.search(r"all_reduce #4 on WORLD: ranks 0-1 wait in it", text.stdout), text.stdout
    assert site("stuck") in text.stdout, text.stdout
    assert "rank 2 last completed #3" in text.stdout and site("warm") in text.stdout, text.stdout
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["world_size"] == 3, report
    assert [(b["waiting"], [r["rank"] for r in b["ranks"]]) for b in report["behind"]] == [
        ([0, 1], [2])
    ], report
    assert unprefixed.returncode == 2, unprefixed
    assert unprefixed.stdout == "", unprefixed.stdout
    assert len(unprefixed.stderr.splitlines()) == 1 and "--prefix" in unprefixed.stderr


def test_a_clean_job_gives_no_report_and_a_rank_without_a_summary_is_named(tmp_path):
    with job("idle", 2, tmp_path, prefix="") as (port, procs):
        wait_until("idle ranks", lambda: len(list(tmp_path.glob("ready*"))) == 2)
        address = f"127.0.0.1:{port}"
        text, _ = doctor("--store", address)
        as_json, _ = doctor("--store", address, "--json")
        wider, _ = doctor("--store", address, "--world-size", "3")
        assert all(p.poll() is None for p in procs), "the job ended before the doctor ran"
        for ready in tmp_path.glob("ready*"):
            ready.unlink()
        outputs = outputs_of(procs, timeout=60)
    for p, out in zip(procs, outputs):
        assert p.returncode == 0 and "DONE idle" in out, out
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("no hang found: all 2 ranks report"), text.stdout
    report = json.loads(as_json.stdout)
    assert (report["behind"], report["desyncs"], report["gone"]) == ([], [], []), report
    assert wider.returncode == 0, wider.stderr
    assert wider.stdout.strip() == "rank 2 is gone: no summary published", wider.stdout


def test_an_unreachable_store_or_a_wrong_token_is_one_line_and_exit_2_quickly(tmp_path):
    with ferrodist_store() as server:
        port = server.port
    # nothing listens there now: the connection is refused until the deadline
    refused, took = doctor("--store", f"127.0.0.1:{port}", "--timeout", "1")
    assert refused.returncode == 2 and refused.stdout == "", refused
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith(f"ferrodist.doctor: 127.0.0.1:{port}: "), refused.stderr
    assert took < 20, took  # an interpreter start (torch's import) and a 1 s deadline
    (tmp_path / "token").write_text(TOKEN)
    with ferrodist_store("--auth-token-file", str(tmp_path / "token")) as server:
        other = secrets.token_hex(16)
        refused, _ = doctor("--store", f"127.0.0.1:{server.port}", token=other)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused
    assert other not in refused.stderr, refused.stderr
    bad, _ = doctor("--store", "no-port-here")
    assert bad.returncode == 2 and "HOST:PORT" in bad.stderr, bad
