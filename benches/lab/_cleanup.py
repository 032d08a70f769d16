"""Which labs are left over from killed runs, and removing them.

A lab holds an exclusive ``flock`` on its own lock file for as long as its owner lives. The
kernel drops that lock when the owner dies, however it dies (SIGKILL included), so a lab whose
lock can be taken is a leftover, and one whose lock is held belongs to a live run (this
process's or another's: parallel labs are never touched). Process ids are in the names only
for people reading ``ip netns list``; they are never trusted, since they get reused.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO, Optional

from ._ip import PREFIX, LabError, lab_namespaces, remove_namespace

#: Where the owner locks live (tmpfs, root only).
LOCK_DIR = Path(os.environ.get("FERRODIST_LAB_LOCKS", "/run/ferrodist-lab"))


def lock_path(name: str) -> Path:
    return LOCK_DIR / f"{name}.lock"


def hold_lock(name: str) -> IO[bytes]:
    """Takes the owner lock of lab ``name``; kept while the returned file stays open."""
    LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    f = open(lock_path(name), "wb")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        f.close()
        raise LabError(f"lab {name} is already owned by a live process") from e
    return f


def lab_of(ns: str) -> str:
    """The lab a namespace belongs to: its name without the ``-role`` suffix."""
    return ns.rsplit("-", 1)[0]


def _try_lock(name: str) -> Optional[IO[bytes]]:
    try:
        return hold_lock(name)
    except LabError:
        return None


def leftover_labs() -> list[str]:
    """Labs whose owner is gone (their namespaces still exist). Probe namespaces count too."""
    names = sorted({lab_of(ns) for ns in lab_namespaces()})
    out = []
    for name in names:
        lock = _try_lock(name)
        if lock is not None:
            lock.close()
            out.append(name)
    return out


def cleanup() -> list[str]:
    """Removes every namespace (and the processes in it) of labs whose owner is gone, with
    their lock files; returns the namespaces removed. Live labs are left alone."""
    removed = []
    for name in sorted({lab_of(ns) for ns in lab_namespaces()}):
        lock = _try_lock(name)
        if lock is None:
            continue
        try:
            for ns in lab_namespaces():
                if lab_of(ns) == name:
                    remove_namespace(ns)
                    removed.append(ns)
            lock_path(name).unlink(missing_ok=True)
        finally:
            lock.close()
    for stale in LOCK_DIR.glob(f"{PREFIX}*.lock") if LOCK_DIR.is_dir() else []:
        lock = _try_lock(stale.name[: -len(".lock")])
        if lock is not None:
            stale.unlink(missing_ok=True)
            lock.close()
    return removed
