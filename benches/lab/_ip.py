"""Running ``ip`` and ``tc``: every command has a deadline and a failure names the command."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from typing import Any

#: Every namespace a lab makes is named ``PREFIX + <owner pid>-<random>-<role>``.
PREFIX = "fdlab-"
#: Deadline of one ``ip``/``tc`` command.
COMMAND_TIMEOUT_S = 20.0


class LabError(RuntimeError):
    """A lab could not be built, used or removed."""


def run(*argv: str, check: bool = True, timeout: float = COMMAND_TIMEOUT_S) -> str:
    """Runs one command, returns its stdout; raises ``LabError`` naming it when it fails."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise LabError(f"{' '.join(argv)} did not finish within {timeout:.0f} s") from e
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def namespaces() -> list[str]:
    """Names of every named network namespace on the machine."""
    out = run("ip", "-j", "netns", "list", check=False)
    try:
        entries = json.loads(out) if out.strip() else []
    except json.JSONDecodeError:
        return []
    return [e["name"] for e in entries]


def lab_namespaces() -> list[str]:
    """Names of the namespaces made by labs (live or left over)."""
    return sorted(n for n in namespaces() if n.startswith(PREFIX))


def namespace_pids(ns: str) -> list[int]:
    """The processes inside a namespace."""
    out = run("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in out.split()]


def new_name() -> str:
    """A lab name no other lab has: the prefix, this process's id and random hex."""
    return f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"


def remove_namespace(ns: str, deadline_s: float = 5.0) -> None:
    """Kills every process left in ``ns`` (each by its id) and deletes the namespace.

    The processes are ones the lab started there: nothing else enters a lab's namespaces.
    A namespace whose processes are gone disappears with its veth ends and bridge.
    """
    end = time.monotonic() + deadline_s
    while True:
        pids = namespace_pids(ns)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > end:
            raise LabError(f"processes {pids} in namespace {ns} survived SIGKILL")
        time.sleep(0.05)
    if ns in namespaces():
        run("ip", "netns", "delete", ns)


def link_stats(ns: str, ifname: str) -> tuple[int, int]:
    """(tx bytes, rx bytes) of an interface inside a namespace."""
    out = run("ip", "-n", ns, "-j", "-s", "link", "show", "dev", ifname)
    stats: Any = json.loads(out)[0]["stats64"]
    return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])


def root_routes() -> list[str]:
    """Destinations of the root namespace's IPv4 routes (to pick a subnet that is not one)."""
    out = run("ip", "-j", "-4", "route", "show", "table", "all", check=False)
    try:
        return [r.get("dst", "") for r in json.loads(out)] if out.strip() else []
    except json.JSONDecodeError:
        return []
