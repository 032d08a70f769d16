"""The flight recorder names who hangs a job: real gloo worlds with a stopped, desynced or
killed rank (``_flight_workers``), diagnosed by the watchdog while the others wait."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _procs import env, outputs_of, spawn

HERE = Path(__file__).resolve().parent
THRESHOLD_S = 1.0
TIMEOUT_S = 8.0


def site(name: str) -> str:
    """``_flight_workers.py:LINE`` of the line marked ``# site: name``."""
    for number, line in enumerate((HERE / "_flight_workers.py").read_text().splitlines(), 1):
        if line.rstrip().endswith(f"# site: {name}"):
            return f"_flight_workers.py:{number}"
    raise AssertionError(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_world(scenario: str, world: int, dump_dir: Path) -> list[subprocess.Popen[str]]:
    """``world`` ranks running ``scenario``; their dumps go to ``dump_dir``."""
    port = free_port()
    code = (
        f"import sys; sys.path.insert(0, {str(HERE)!r}); import _flight_workers as w; "
        "w.main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), "
        "float(sys.argv[5]))"
    )
    saved = dict(os.environ)
    os.environ["FERRODIST_HANG_THRESHOLD_S"] = str(THRESHOLD_S)
    os.environ["FERRODIST_FLIGHT_DUMP_DIR"] = str(dump_dir)
    try:
        return [
            spawn(code, scenario, str(r), str(world), str(port), str(TIMEOUT_S))
            for r in range(world)
        ]
    finally:
        os.environ.clear()
        os.environ.update(saved)


def values(output: str, key: str) -> list[str]:
    return [
        line[len(key) + 1 :].replace("\\n", "\n")
        for line in output.splitlines()
        if line.startswith(key + " ")
    ]


def stuck_report_logs(outputs: list[str]) -> list[str]:
    return [line for out in outputs for line in out.splitlines() if "a collective is stuck" in line]


def test_a_stopped_rank_is_named_behind_with_its_last_op_within_twice_the_threshold(tmp_path):
    procs = start_world("stopped", 3, tmp_path)
    # Rank 2 stops itself; the others wait in the all_reduce until the group's timeout.
    outputs = outputs_of(procs[:2], timeout=60)
    stopped = procs[2]
    stopped.send_signal(signal.SIGKILL)
    outputs_of([stopped], timeout=10)
    for out in outputs:
        after = values(out, "REPORT_AFTER")
        assert after, out
        assert float(after[0]) <= 2 * THRESHOLD_S + 0.5, out  # a loaded 2-core machine's slack
        report = values(out, "REPORT")[0]
        assert re.search(r"ranks? 0-1 wait in it", report), report
        assert "rank 2 last completed #3" in report, report
        assert site("warm") in report, report
        # the timeout error the waiting rank raises carries the diagnosis
        error = values(out, "ERROR")
        assert error and "rank 2 last completed" in error[0], out
    assert len(stuck_report_logs(outputs)) == 1, outputs
    # a stopped process heartbeats no more: once that is older than the limit, one more line
    gone = [line for out in outputs for line in out.splitlines() if "rank 2 is gone now" in line]
    assert len(gone) == 1, outputs


def logged_once(scenario: str, world: int, tmp_path: Path) -> str:
    """The report of a ``scenario`` whose ranks all wait in their ``_stuck_in`` op: the first
    one a rank kept, after checking that the job logged one, once."""
    outputs = outputs_of(start_world(scenario, world, tmp_path), timeout=60)
    reports = [r for out in outputs for r in values(out, "REPORT")]
    assert reports, outputs
    assert len(stuck_report_logs(outputs)) == 1, outputs
    return reports[0]


def test_a_rank_issuing_another_op_is_a_desync_naming_both_call_sites(tmp_path):
    report = logged_once("desync", 3, tmp_path)
    assert "desync at #4 on WORLD" in report, report
    assert site("desync_broadcast") in report and site("desync_all_reduce") in report, report
    assert "broadcast" in report and "all_reduce" in report, report


def test_two_ranks_each_receiving_first_are_named_with_where_each_waits(tmp_path):
    report = logged_once("p2p_deadlock", 3, tmp_path)
    assert "p2p 1->0 #1 on WORLD:p2p:1->0: rank 0 waits in it" in report, report
    assert f"waits in p2p 0->1 #1 on WORLD:p2p:0->1 at {site('deadlock_recv_1')}" in report, report
    assert "p2p 0->1 #1 on WORLD:p2p:0->1: rank 1 waits in it" in report, report
    assert f"waits in p2p 1->0 #1 on WORLD:p2p:1->0 at {site('deadlock_recv_0')}" in report, report


def test_a_killed_rank_is_gone(tmp_path):
    outputs = outputs_of(start_world("killed", 3, tmp_path), timeout=60)
    for out in outputs[:2]:
        error = values(out, "ERROR")
        assert error, out
        assert re.search(r"rank 2\b.*gone|gone.*rank 2\b", error[0], re.S), error[0]


@pytest.mark.parametrize("as_json", [False, True])
def test_sigusr1_dumps_a_stuck_rank_and_the_doctor_reads_the_dumps(tmp_path, as_json):
    procs = start_world("sigusr1", 2, tmp_path)
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("ready*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # rank 1 is now in the all_reduce, rank 0 asleep
        for p in procs:
            p.send_signal(signal.SIGUSR1)
        while len(list(tmp_path.glob("rank*.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        dumps = sorted(p.name for p in tmp_path.glob("rank*.json"))
    finally:
        for p in procs:
            p.kill()
        outputs = outputs_of(procs, timeout=10)
    assert dumps == ["rank0.json", "rank1.json"], outputs
    for name in dumps:
        dumped = json.loads((tmp_path / name).read_text())
        assert dumped["format"] == "ferrodist-flight-recorder" and dumped["version"] == 1
        assert dumped["reason"] == "SIGUSR1", dumped["reason"]
    args = [sys.executable, "-m", "ferrodist.doctor", str(tmp_path)] + (
        ["--json"] if as_json else []
    )
    done = subprocess.run(args, capture_output=True, text=True, env=env(), timeout=60)
    assert done.returncode == 0, done.stderr
    if as_json:
        report = json.loads(done.stdout)
        assert [b["ranks"][0]["rank"] for b in report["behind"]] == [0], report
        assert report["behind"][0]["waiting"] == [1], report
    else:
        assert "rank 0 last completed #3" in done.stdout, done.stdout
        assert site("stuck") in done.stdout, done.stdout


def test_a_failure_gets_a_report_only_where_the_diagnosis_can_explain_it():
    """An op that fails at once on every rank (torch 2.4's gloo refuses ``ReduceOp.AVG`` when
    waited for) must not carry a hang report built from summaries published before it: ranks
    "behind" count only once the op has waited the threshold; a gone rank or a desync at once."""
    from types import SimpleNamespace

    from ferrodist.debug._watchdog import Watchdog, _Findings

    watchdog = SimpleNamespace(threshold_s=THRESHOLD_S)

    def explains(gone: list[int], desynced: bool, waited_s: float) -> bool:
        findings = _Findings("report", True, [1], gone, desynced, waited_s)
        return Watchdog._explains_failure(watchdog, findings)  # type: ignore[arg-type]

    assert not explains([], False, 0.01)  # merely not yet seen issuing it
    assert explains([], False, THRESHOLD_S)  # waited as long as a hang must
    assert explains([2], False, 0.01)  # a peer died under the op
    assert explains([], True, 0.01)  # ranks issued different ops at this number
