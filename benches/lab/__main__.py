"""The lab's command line.

    python -m benches.lab run [--hosts 2] [--rate 1gbit|10gbit|unshaped] [--ranks-per-host 1]
                              [--timeout 600] -- python train.py ARGS
    python -m benches.lab cleanup     # remove what killed runs left behind (live labs stay)
    python -m benches.lab list        # lab namespaces on this machine, leftovers marked
    python -m benches.lab check       # whether this machine can host a lab, and why not

``run`` builds a lab, runs the command as every rank (torch's env:// variables set, gloo bound
to the lab interface), prints each rank's output and each host's bytes on the wire, removes
the lab and exits with the first failing rank's code (0 when all succeed).
"""

from __future__ import annotations

import argparse
import sys

from ._cleanup import cleanup, lab_of, leftover_labs
from ._ip import lab_namespaces
from ._lab import Lab
from ._probe import unavailable


def _run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("run: no command given (put it after --)", file=sys.stderr)
        return 2
    reason = unavailable()
    if reason:
        print(f"lab unavailable: {reason}", file=sys.stderr)
        return 2
    with Lab(hosts=args.hosts, rate=args.rate) as lab:
        before = lab.counters()
        results = lab.launch(command, ranks_per_host=args.ranks_per_host, timeout=args.timeout)
        after = lab.counters()
    for r in results:
        state = "killed at the deadline" if r.timed_out else f"exit {r.returncode}"
        print(f"--- rank {r.rank} (host {r.host}): {state}")
        sys.stdout.write(r.output)
    for host in sorted(after):
        tx = after[host][0] - before[host][0]
        rx = after[host][1] - before[host][1]
        print(f"host {host}: sent {tx:,} B, received {rx:,} B")
    return next((r.returncode or 1 for r in results if r.returncode != 0), 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.lab", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="run a command as the ranks of a fresh lab")
    run.add_argument("--hosts", type=int, default=2)
    run.add_argument("--rate", default="1gbit")
    run.add_argument("--ranks-per-host", type=int, default=1)
    run.add_argument("--timeout", type=float, default=600.0)
    run.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("cleanup", help="remove leftovers of killed runs")
    sub.add_parser("list", help="list lab namespaces")
    sub.add_parser("check", help="can this machine host a lab?")
    args = parser.parse_args(argv)
    if args.what == "run":
        return _run(args)
    if args.what == "cleanup":
        for ns in cleanup():
            print(f"removed {ns}")
        return 0
    if args.what == "list":
        stale = set(leftover_labs())
        for ns in lab_namespaces():
            print(f"{ns}{'  (leftover: owner gone)' if lab_of(ns) in stale else ''}")
        return 0
    reason = unavailable()
    print(f"lab unavailable: {reason}" if reason else "ok: this machine can host a lab")
    return 1 if reason else 0


if __name__ == "__main__":
    sys.exit(main())
