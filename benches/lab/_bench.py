"""Running a bench's workers on the lab: one rank per host, the results read from rank 0.

Why here: every lab bench (``bench_comm_bound``, ``bench_zero_overlap``) starts itself again
as ``--worker`` inside each host, with this checkout on the path, waits for the ranks under a
deadline, says which rank failed and how, and reads the JSON rows rank 0 printed after
``RESULT``. One copy of that, so the benches hold only what they measure and print.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from ._lab import Lab
from ._probe import unavailable

REPO = Path(__file__).resolve().parents[2]


def run_workers(
    name: str,
    script: str,
    rate: str,
    timeout: float,
    report: Callable[[list[dict[str, Any]], float], None],
    ranks_per_host: int = 1,
) -> int:
    """Runs ``script --worker <this command's arguments>`` in a 2-host lab at ``rate``
    (``ranks_per_host`` ranks on each host) and hands rank 0's rows and the link rate (bit/s) to
    ``report``; the exit status for ``main``."""
    reason = unavailable()
    if reason:
        print(f"{name}: lab unavailable ({reason}); nothing measured")
        return 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "python"), env.get("PYTHONPATH", "")]
    )
    argv = [sys.executable, str(Path(script).resolve()), "--worker", *sys.argv[1:]]
    with Lab(hosts=2, rate=rate) as lab:
        results = lab.launch(argv, env=env, timeout=timeout, ranks_per_host=ranks_per_host)
        rate_bps = lab.rate_bps
    for r in results:
        if r.returncode != 0:
            state = "killed at the deadline" if r.timed_out else f"exit {r.returncode}"
            print(f"rank {r.rank} failed ({state}):\n{r.output}")
            return 1
    line = next(x for x in results[0].output.splitlines() if x.startswith("RESULT "))
    report(json.loads(line[len("RESULT ") :]), rate_bps)
    return 0


def lab_main(
    parser: argparse.ArgumentParser,
    worker: Callable[[argparse.Namespace], None],
    report: Callable[[list[dict[str, Any]], float, argparse.Namespace], None],
    name: str,
    script: str,
) -> int:
    """A lab bench's ``main``: adds ``--timeout`` and the hidden ``--worker`` to ``parser`` (which
    has ``--rate``), then runs one rank (``--worker``, inside a host) or the whole lab, handing
    rank 0's rows to ``report(rows, rate_bps, args)``. ``--ranks-per-host``, where the bench
    has it, places that many ranks on each host."""
    parser.add_argument("--timeout", type=float, default=900.0, help="deadline of the run, s")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    return run_workers(
        name,
        script,
        args.rate,
        args.timeout,
        lambda rows, rate_bps: report(rows, rate_bps, args),
        getattr(args, "ranks_per_host", 1),
    )
