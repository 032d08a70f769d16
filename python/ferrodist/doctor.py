"""``python -m ferrodist.doctor DIR | --store HOST:PORT [--json]``: the hang diagnosis, from
flight recorder dumps or from a running job's store.

Each rank of a job writes its ring to ``DIR/rank<R>.json`` on a timeout, on ``SIGUSR1`` or
from ``ferrodist.debug.dump()``. This reads every dump in ``DIR`` and prints what the watchdog
would have said while the job hung: who is behind, who diverged, and which ranks left no dump
(gone). A dump is a snapshot, not a heartbeat, so no rank counts as gone for being old.

While a job hangs, nothing has to be dumped: every rank's watchdog keeps its summary (with a
heartbeat) in the job's store under ``ferrodist/flight/<rank>``, and the world size and the
heartbeat timeout under ``ferrodist/flight/job``. ``--store`` connects to that store as one
more client (ferrodist's server or torch's; the token, where the server wants one, comes from
``FERRODIST_STORE_TOKEN`` or ``FERRODIST_STORE_TOKEN_FILE``, never from the command line),
reads every rank's summary within ``--timeout`` seconds and runs the same Rust diagnosis the
watchdog runs; a rank whose heartbeat is older than the job's timeout is gone, a rank without
a summary is named as such. A job that handed ``init_process_group`` a ``PrefixStore`` keeps
those keys under its prefix (``--prefix``).

Exit status: 0 when the summaries were read (whatever they show), 2 when there was nothing to
read: no dump, a store that cannot be reached or refuses this client, no summary in it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any, Optional

from ferrodist import _native
from ferrodist.debug._watchdog import JOB_KEY, KEY_PREFIX
from ferrodist.stores.prefix import PrefixStore
from ferrodist.stores.tcp import TCPStore

__all__ = ["diagnose_dir", "diagnose_store", "main"]

_NEVER_GONE_S = 10.0 * 365 * 24 * 3600
"""A heartbeat timeout no dump outlives: dumps are judged by their content, not their age."""

DEFAULT_TIMEOUT_S = 10.0
"""How long ``--store`` may take to connect and read every summary, unless ``--timeout``."""


class Unreadable(Exception):
    """Nothing to diagnose: the store cannot be reached, refuses us, or holds no summary."""


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


def host_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port)."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host, int(port)


def diagnose_store(
    address: str,
    world_size: Optional[int] = None,
    prefix: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    heartbeat_timeout_s: Optional[float] = None,
) -> tuple[str, str]:
    """(report text, report JSON) from the summaries a running job keeps in its store.

    ``world_size`` and ``heartbeat_timeout_s`` default to what the job published.

    Raises:
        Unreadable: the store did not answer within ``timeout_s``, refused this client, or
            holds no summary where this looked (the message says where, never a token).
    """
    host, port = host_port(address)
    where = f"{prefix}/{KEY_PREFIX}" if prefix else KEY_PREFIX
    deadline = time.monotonic() + timeout_s

    def left() -> timedelta:
        seconds = deadline - time.monotonic()
        if seconds <= 0:
            raise TimeoutError(f"did not answer within {timeout_s:g} s")
        return timedelta(seconds=seconds)

    try:
        store: Any = TCPStore(host, port, timeout=left())  # the token: from the environment
        if prefix:
            store = PrefixStore(prefix, store)

        def read(keys: list[str]) -> list[str]:
            present = []
            for key in keys:
                store.set_timeout(left())
                if store.check([key]):
                    present.append(key)
            store.set_timeout(left())
            values = store.multi_get(present) if present else []
            return [v.decode("utf-8", "replace") for v in values]

        job = json.loads((read([JOB_KEY]) or ["{}"])[0])
        world = world_size or int(job.get("world_size") or 0)
        if world <= 0:
            raise Unreadable(
                f"{address}: no flight recorder summaries under {where!r} (a job that handed "
                "init_process_group a PrefixStore keeps them under its prefix: --prefix; one "
                "whose watchdog never started has none; --world-size reads them anyway)"
            )
        summaries = read([f"{KEY_PREFIX}{r}" for r in range(world)])
    except Unreadable:
        raise
    except (RuntimeError, OSError, ValueError) as e:  # DistError, TimeoutError, bad JSON
        raise Unreadable(f"{address}: {' '.join(str(e).split())}") from None
    if not summaries:
        raise Unreadable(f"{address}: none of the {world} ranks has a summary under {where!r}")
    timeout = heartbeat_timeout_s or float(job.get("heartbeat_timeout_s") or 0) or 60.0
    try:
        return _native.flight_diagnose(summaries, world, timeout)
    except ValueError as e:  # a summary of another version
        raise Unreadable(f"{address}: {e}") from None


def _address(text: str) -> str:
    try:
        host_port(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ferrodist.doctor",
        description="Diagnose a hung job from its ranks' flight recorder dumps, or from the "
        "summaries its ranks keep in the job's store while it runs.",
    )
    parser.add_argument("dir", nargs="?", help="a directory of dumps (rank<R>.json)")
    parser.add_argument(
        "--store",
        metavar="HOST:PORT",
        type=_address,
        help="read the summaries from this running job's TCPStore instead (auth token, if "
        "any: FERRODIST_STORE_TOKEN or FERRODIST_STORE_TOKEN_FILE)",
    )
    parser.add_argument(
        "--world-size", type=int, help="with --store: the job's ranks (default: as published)"
    )
    parser.add_argument(
        "--prefix", default="", help="with --store: the prefix of the job's PrefixStore"
    )
    parser.add_argument(
        "--timeout",
        type=_positive,
        default=DEFAULT_TIMEOUT_S,
        help="with --store: seconds to connect and read everything (default %(default)g)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=_positive,
        help="with --store: seconds without a heartbeat after which a rank is gone "
        "(default: the job's)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if (args.dir is None) == (args.store is None):
        parser.error("give a directory of dumps or --store HOST:PORT (one of them)")
    if args.store is None and (args.world_size or args.prefix or args.heartbeat_timeout):
        parser.error("--world-size, --prefix and --heartbeat-timeout go with --store")
    if args.world_size is not None and args.world_size <= 0:
        parser.error(f"--world-size must be > 0, got {args.world_size}")
    problems: list[str] = []
    try:
        if args.store is None:
            text, report, problems = diagnose_dir(args.dir)
        else:
            text, report = diagnose_store(
                args.store, args.world_size, args.prefix, args.timeout, args.heartbeat_timeout
            )
    except (FileNotFoundError, Unreadable) as e:
        print(f"ferrodist.doctor: {e}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"ferrodist.doctor: skipped {problem}", file=sys.stderr)
    if args.json:
        print(report)
    else:
        print(text.rstrip() or "no hang, desync or missing rank found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
