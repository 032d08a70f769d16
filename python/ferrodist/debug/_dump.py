"""Writing this rank's ring to a file: on request, on ``SIGUSR1``, when a recorded op fails.

The file is the recorder's versioned dump (``{"format": "ferrodist-flight-recorder",
"version": 1, ...}``, written by the Rust core), one per rank, named ``rank<R>.json`` so that a
later dump of the same rank replaces the earlier one and ``python -m ferrodist.doctor DIR``
reads one file per rank. It is written to a temporary name and renamed, so a reader never sees
half a dump.

``SIGUSR1`` must work while the main thread is stuck inside a collective, where a Python signal
handler would not run until the op returns: the watchdog thread watches the interpreter's signal
wakeup fd and dumps from there (``_watchdog``); the Python-level handler installed here is what
makes the interpreter write to that fd, and dumps itself only when no watchdog does.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import stat
import tempfile
from typing import Any, Optional

import torch.distributed as _tdist

from ferrodist.debug import _recorder

__all__ = ["dump", "dump_dir", "install_sigusr1", "uninstall_sigusr1"]

logger = logging.getLogger("ferrodist.debug")


def dump_dir() -> str:
    """``FERRODIST_FLIGHT_DUMP_DIR``, else ``<tmp>/ferrodist-flight-<uid>`` (made private)."""
    chosen = os.environ.get("FERRODIST_FLIGHT_DUMP_DIR")
    if chosen:
        return chosen
    path = os.path.join(tempfile.gettempdir(), f"ferrodist-flight-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    # In a shared temp directory another user may have made this name first (a symlink, or a
    # directory of theirs): writing there would hand them the file. Only our own directory do.
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(
            f"{path} is not a directory of this user; set FERRODIST_FLIGHT_DUMP_DIR to a "
            "directory for flight recorder dumps"
        )
    return path


def _rank_and_world() -> tuple[int, int]:
    if _tdist.is_available() and _tdist.is_initialized():
        return _tdist.get_rank(), _tdist.get_world_size()
    return 0, 1


def dump(path: Optional[str] = None, reason: str = "manual") -> Optional[str]:
    """Write this rank's flight recorder ring to a file; returns its path (None when recording
    is off).

    Args:
        path: a file, or a directory that gets ``rank<R>.json``; default: the dump directory
            (``FERRODIST_FLIGHT_DUMP_DIR``, else ``<tmp>/ferrodist-flight-<uid>``).

    Raises:
        PermissionError: the default directory's name is taken by something not this user's.
        reason: recorded in the dump (``manual``, ``SIGUSR1``, ``failed: ...``).
    """
    rec = _recorder.recorder()
    if rec is None:
        return None
    _recorder.sweep()
    rank, world = _rank_and_world()
    target = dump_dir() if path is None else os.fspath(path)
    if path is None or os.path.isdir(target):
        os.makedirs(target, exist_ok=True)
        target = os.path.join(target, f"rank{rank}.json")
    text = rec.dump_json(rank, world, reason)
    # A fresh name, created here and never followed through a link, then renamed over the dump.
    tmp = f"{target}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, target)
    return target


def dump_quietly(reason: str) -> None:
    """:func:`dump` for the failure and signal paths: a failure is logged, never raised."""
    try:
        where = dump(reason=reason)
    except Exception as e:
        logger.warning("ferrodist flight recorder: could not write the dump: %s", e)
        return
    if where is not None:
        logger.warning("ferrodist flight recorder: dumped this rank's ring to %s", where)


class _Sigusr1:
    installed = False
    handled_by_watchdog = False


def _on_sigusr1(signum: int, frame: Any) -> None:
    if not _Sigusr1.handled_by_watchdog:
        dump_quietly("SIGUSR1")


def install_sigusr1() -> bool:
    """Install the ``SIGUSR1`` dump handler, only where the program has none of its own and only
    from the main thread; True when installed."""
    if _Sigusr1.installed:
        return True
    try:
        if signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL:
            return False
        signal.signal(signal.SIGUSR1, _on_sigusr1)
    except ValueError:  # not the main thread
        return False
    _Sigusr1.installed = True
    return True


def uninstall_sigusr1() -> None:
    """Put ``SIGUSR1`` back to its default, if the handler is still ours."""
    if not _Sigusr1.installed:
        return
    try:
        if signal.getsignal(signal.SIGUSR1) is _on_sigusr1:
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    except ValueError:
        return
    _Sigusr1.installed = False
    _Sigusr1.handled_by_watchdog = False
