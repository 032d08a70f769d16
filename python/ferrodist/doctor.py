"""``python -m ferrodist.doctor DIR [--json]``: the hang diagnosis, from flight recorder dumps.

Each rank of a job writes its ring to ``DIR/rank<R>.json`` on a timeout, on ``SIGUSR1`` or
from ``ferrodist.debug.dump()``. This reads every dump in ``DIR`` and prints what the watchdog
would have said while the job hung: who is behind, who diverged, and which ranks left no dump
(gone). A dump is a snapshot, not a heartbeat, so no rank counts as gone for being old.

Exit status: 0 when the dumps were read (whatever they show), 2 when there was nothing to read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

from ferrodist import _native

__all__ = ["diagnose_dir", "main"]

_NEVER_GONE_S = 10.0 * 365 * 24 * 3600
"""A heartbeat timeout no dump outlives: dumps are judged by their content, not their age."""


def diagnose_dir(path: str) -> tuple[str, str, list[str]]:
    """(report text, report JSON, problems) for the dumps in ``path``.

    Raises:
        FileNotFoundError: ``path`` is not a directory, or holds no readable dump.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: not a directory")
    summaries: list[str] = []
    problems: list[str] = []
    world_size = 0
    for name in sorted(os.listdir(path)):
        if not name.endswith(".json"):
            continue
        file = os.path.join(path, name)
        try:
            with open(file, encoding="utf-8") as f:
                text = f.read()
            summary = _native.flight_summary_from_dump(text)
            world_size = max(world_size, int(json.loads(text).get("world_size", 0)))
        except (OSError, ValueError) as e:
            problems.append(f"{name}: {e}")
            continue
        summaries.append(summary)
    if not summaries:
        raise FileNotFoundError(f"{path}: no flight recorder dump (rank<R>.json) in it")
    text, report = _native.flight_diagnose(summaries, world_size, _NEVER_GONE_S)
    return text, report, problems


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ferrodist.doctor",
        description="Diagnose a hung job from its ranks' flight recorder dumps.",
    )
    parser.add_argument("dir", help="a directory of dumps (rank<R>.json)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        text, report, problems = diagnose_dir(args.dir)
    except FileNotFoundError as e:
        print(f"ferrodist.doctor: {e}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"ferrodist.doctor: skipped {problem}", file=sys.stderr)
    if args.json:
        print(report)
    else:
        print(text.rstrip() or "no hang, desync or missing rank found in these dumps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
