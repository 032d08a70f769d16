"""The flight recorder names a host whose link is cut (issue 28, item 5), on the multi-host lab.

Three hosts (network namespaces), one gloo rank on each, the job's store hosted in-process by
rank 0 on host 0 (env://, ``MASTER_ADDR`` as the lab sets it). After clean steps the test pulls
host 2's cable (``Lab.cut``: its switch port down; its process lives on, its connections are
not reset, its packets go nowhere) and the ranks issue one more all_reduce. Ranks 0 and 1 wait
in it until the group's timeout; rank 2's heartbeat stops reaching the store. The watchdog on
rank 0 or 1 must log, within about twice the hang threshold, that ranks 0-1 wait for rank 2
and that rank 2 is gone (no heartbeat), and the timeout error they raise must carry the
report. Skips with the lab's reason where no lab can be built.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _procs import env as proc_env

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benches.lab import Lab, lab_namespaces, unavailable  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

THRESHOLD_S = 1.0
TIMEOUT_S = 20.0
STEPS = 12
SLACK_S = 0.75  # a loaded 2-core machine's: three ranks, a watchdog tick of threshold/4
WORKER = HERE / "_flight_lab_worker.py"


@pytest.fixture(autouse=True)
def _needs_lab() -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)


def site(name: str) -> str:
    for number, line in enumerate(WORKER.read_text().splitlines(), 1):
        if line.rstrip().endswith(f"# site: {name}"):
            return f"{WORKER.name}:{number}"
    raise AssertionError(name)


def values(output: str, key: str) -> list[str]:
    return [
        line[len(key) + 1 :].replace("\\n", "\n")
        for line in output.splitlines()
        if line.startswith(key + " ")
    ]


def _wait_for(paths: list[Path], word: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if all(word in p.read_text(errors="replace") for p in paths):
            return True
        time.sleep(0.05)
    return False


def _ageless(text: str) -> str:
    """``text`` with its ages (``1.3 s``, ``43 s``) made equal, to compare two reports."""
    return re.sub(r"\d+(\.\d+)? s\b", "N s", text)


def test_a_host_whose_link_is_cut_is_named_gone_and_the_error_carries_it(tmp_path: Path) -> None:
    env = proc_env()
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env["PYTHONPATH"]
    env.update(
        FERRODIST_HANG_THRESHOLD_S=str(THRESHOLD_S),
        FERRODIST_FLIGHT_DUMP_DIR=str(tmp_path / "dumps"),
        FLIGHT_LAB_DIR=str(tmp_path),
    )
    logs = [tmp_path / f"rank{r}.log" for r in range(3)]
    with Lab(hosts=3, rate="1gbit") as lab:
        procs = []
        for rank in range(3):
            with open(logs[rank], "wb") as out:
                procs.append(
                    lab.popen(
                        rank,
                        [sys.executable, str(WORKER), str(STEPS), str(TIMEOUT_S)],
                        env=lab.rank_env(rank, rank, 0, 1, 29500, env),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        clean = _wait_for(logs, "CLEAN", time.monotonic() + 90)
        assert clean, [p.read_text(errors="replace") for p in logs]
        lab.cut(2)
        (tmp_path / "go").touch()
        deadline = time.monotonic() + TIMEOUT_S + 30
        for proc in procs[:2]:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        name = lab.name
    # the lab went with its processes (rank 2 still waited); its exit removes them on failure too
    assert not [ns for ns in lab_namespaces() if ns.startswith(name)]
    assert all(p.poll() is not None for p in procs)
    outputs = [p.read_text(errors="replace") for p in logs]
    # the cut host itself can only say that the store stopped answering
    assert "flight recorder watchdog: no reply from the store at" in outputs[2], outputs[2]

    stuck_logs, gone_logs = [], []
    for rank, out in enumerate(outputs[:2]):
        # nothing was reported while the steps ran clean
        assert not values(out, "FALSE_REPORT"), out
        before, _, after = out.partition("\nSTUCK ")
        assert after and "LOGGED" not in before, out
        logged = [m.split(" ", 1) for m in values(out, "LOGGED")]
        stuck_logs += [(rank, float(t), m) for t, m in logged if "a collective is stuck" in m]
        gone_logs += [(rank, float(t), m) for t, m in logged if "rank 2 is gone" in m]
        # the watchdog kept a report within about twice the threshold, naming rank 2 gone...
        assert float(values(out, "REPORT_AFTER")[0]) <= 2 * THRESHOLD_S + SLACK_S, out
        assert float(values(out, "GONE_AFTER")[0]) <= 2 * THRESHOLD_S + SLACK_S, out
        # ...and the group's timeout ended the wait with an error that carries it
        assert float(values(out, "ERROR_AFTER")[0]) >= TIMEOUT_S - 1, out
        error = values(out, "ERROR")[0]
        assert "ferrodist flight recorder:" in error, error
        assert re.search(r"rank 2 is gone: no heartbeat for \d+ s \(host ", error), error
    # logged once for the job, naming the op, who waits and who they wait for...
    assert len(stuck_logs) == 1, outputs
    rank, after, logged = stuck_logs[0]
    assert after <= 2 * THRESHOLD_S + SLACK_S, stuck_logs
    assert re.search(
        rf"all_reduce #{STEPS + 1} on WORLD: ranks 0-1 wait in it \(for [\d.]+ s, "
        rf"at {re.escape(site('cut'))}\); rank 2 last completed #{STEPS} \(all_reduce at "
        rf"{WORKER.name}:\d+\) [\d.]+ s ago and has issued nothing since",
        logged,
    ), logged
    error = values(outputs[rank], "ERROR")[0]
    for line in logged.splitlines()[1:]:
        assert _ageless(line) in _ageless(error), (line, error)
    # ...and, once its heartbeat is older than the watchdog's limit (twice the threshold),
    # that rank 2 is gone: a cut host, not a slow one (which keeps its heartbeat)
    assert len(gone_logs) == 1, outputs
    rank, after, logged = gone_logs[0]
    assert after <= 2 * THRESHOLD_S + SLACK_S, gone_logs
    assert re.search(r"rank 2 is gone: no heartbeat for [\d.]+ s \(host ", logged), logged
    assert _ageless(logged.splitlines()[-1]) in _ageless(values(outputs[rank], "ERROR")[0])
