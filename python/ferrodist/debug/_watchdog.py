"""The hang watchdog: one daemon thread per process while the default group lives.

Why a thread and the store: a rank stuck in a collective cannot say anything from the thread
that is stuck, and the other ranks cannot see its ring. So every few seconds this thread
publishes a compact summary of its ring (``ferrodist/flight/<rank>``, with a heartbeat; once
``ferrodist/flight/job``, the world size) to the job's store, which every rank already shares
and ``python -m ferrodist.doctor --store`` reads; when this rank's oldest pending op has waited
longer than the threshold, it reads the other ranks' summaries and runs the Rust diagnosis
(``flight_diagnose``): who is behind, who diverged (a desync), who is gone. The report is logged
once for the whole job (the first waiting rank to claim the op's key with the store's ``add``
logs it) and kept, so that the error the stuck op finally raises carries it. A rank that looked
behind in that report and whose heartbeat stops later (its host cut off or dead, its process
frozen) is logged once more when it turns gone, within the heartbeat timeout.

Every store call goes through a clone of the store with a short timeout (the main thread's store
keeps its own) and reads only keys that ``check`` says exist, so the thread never blocks long.
It is a daemon, stopped and joined by ``destroy_process_group`` and at exit, and it does not
exist in a forked child. A rank whose summary names a process on this host that no longer exists
counts as gone at once (a SIGKILLed rank), without waiting for its heartbeat to age.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import signal
import socket
import threading
import time
from datetime import timedelta
from typing import Any, NamedTuple, Optional

from ferrodist import _native
from ferrodist.debug import _dump, _recorder

__all__ = ["Watchdog", "last_report", "start", "stop"]

logger = logging.getLogger("ferrodist.debug")

KEY_PREFIX = "ferrodist/flight/"
JOB_KEY = f"{KEY_PREFIX}job"
"""What a reader of the summaries from outside the job needs besides them (``python -m
ferrodist.doctor --store``): JSON with the world size and the heartbeat timeout."""
_STORE_TIMEOUT_S = 2.0


def threshold_from_env(group_timeout: timedelta) -> float:
    """``FERRODIST_HANG_THRESHOLD_S``, else a quarter of the group's timeout (seconds)."""
    raw = os.environ.get("FERRODIST_HANG_THRESHOLD_S", "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(
                f"FERRODIST_HANG_THRESHOLD_S must be a number of seconds, got {raw!r}"
            ) from None
        if value > 0:
            return value
    return max(group_timeout.total_seconds() / 4, 0.1)


def _short_store(store: Any) -> Any:
    """A clone of ``store`` with a short timeout, or ``store`` itself where it cannot clone."""
    try:
        clone = store.clone()
    except Exception:
        return store
    if clone is not store:
        try:
            clone.set_timeout(timedelta(seconds=_STORE_TIMEOUT_S))
        except Exception:
            pass
    return clone


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (killed, not yet reaped by its launcher) is gone too
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def _waited_s(op: dict[str, Any]) -> float:
    """How long a pending op of a summary has waited since it was issued."""
    return time.time() - (op.get("issued_at_ms") or 0) / 1000


class _Findings(NamedTuple):
    """One diagnosis, as ``Watchdog._diagnose`` reads it from every rank's summary."""

    text: str
    found: bool
    waiting: list[int]
    gone: list[int]
    desynced: bool
    waited_s: float
    """How long this rank's oldest pending op has waited (0 when none is pending)."""


class Watchdog:
    """The thread and what it keeps: the latest report, and whether it was logged."""

    def __init__(
        self, store: Any, rank: int, world_size: int, threshold_s: float, period_s: float
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.threshold_s = threshold_s
        self.period_s = period_s
        self.heartbeat_timeout_s = max(2 * threshold_s, 4 * period_s)
        self.report: Optional[str] = None
        self._job_published = False
        self._store = _short_store(store)
        self._host = socket.gethostname()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._logged: set[str] = set()
        self._gone_logged: dict[str, set[int]] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._signal_fd = False
        self._thread = threading.Thread(
            target=self._loop, name="ferrodist-flight-watchdog", daemon=True
        )

    # --- lifecycle ---

    def start(self) -> None:
        """Publish this rank's first summary now (so that the key exists from the moment the
        group does, and a rank that dies at once is known by its pid), then start the thread."""
        try:
            self.publish_job()
            self.publish()
        except Exception as e:  # the thread retries at its first tick
            logger.warning("ferrodist flight recorder: could not publish to the store: %s", e)
        self._watch_signals()
        self._thread.start()

    def publish_job(self) -> None:
        """Set the job's world size and heartbeat timeout (the same from every rank), so that
        the doctor reading the store knows which ranks to expect and when one is gone."""
        job = {"world_size": self.world_size, "heartbeat_timeout_s": self.heartbeat_timeout_s}
        with self._lock:
            self._store.set(JOB_KEY, json.dumps(job))
        self._job_published = True

    def publish(self) -> str:
        """Set this rank's summary (and heartbeat) in the store; returns it."""
        rec = _recorder.recorder()
        if rec is None:
            return ""
        _recorder.sweep()
        mine = rec.summary_json(self.rank)
        with self._lock:
            self._store.set(f"{KEY_PREFIX}{self.rank}", mine)
        return mine

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._unwatch_signals()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _watch_signals(self) -> None:
        """Have the interpreter write signal numbers to our pipe, so SIGUSR1 is seen by this
        thread even while the main thread is stuck (only where no one else uses the fd)."""
        if not _dump.install_sigusr1():
            return
        try:
            previous = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        except ValueError:  # not the main thread
            return
        if previous != -1:  # someone else's (asyncio): give it back, dump from the handler
            signal.set_wakeup_fd(previous)
            return
        self._signal_fd = True
        _dump._Sigusr1.handled_by_watchdog = True

    def _unwatch_signals(self) -> None:
        if self._signal_fd:
            try:
                previous = signal.set_wakeup_fd(-1)
                if previous not in (-1, self._wake_w):  # someone replaced ours: keep theirs
                    signal.set_wakeup_fd(previous)
            except ValueError:
                pass
            self._signal_fd = False
        _dump.uninstall_sigusr1()

    # --- the loop ---

    def _loop(self) -> None:
        next_tick = time.monotonic() + self.period_s
        while not self._stop.is_set():
            timeout = max(0.0, next_tick - time.monotonic())
            try:
                ready, _, _ = select.select([self._wake_r], [], [], timeout)
            except (OSError, ValueError):
                return
            if ready:
                try:
                    data = os.read(self._wake_r, 64)
                except OSError:
                    return
                if signal.SIGUSR1 in data:
                    _dump.dump_quietly("SIGUSR1")
                continue
            next_tick = time.monotonic() + self.period_s
            try:
                self.tick()
            except Exception as e:  # a store that went away: say so once, keep trying
                if "tick" not in self._logged:
                    self._logged.add("tick")
                    logger.warning("ferrodist flight recorder watchdog: %s", e)

    def tick(self) -> None:
        """Publish this rank's summary; diagnose when its oldest pending op is too old."""
        if not self._job_published:
            self.publish_job()
        mine = self.publish()
        if not mine:
            return
        pending = json.loads(mine).get("pending") or []
        if not pending:
            self.report = None
            return
        oldest = pending[0]
        if _waited_s(oldest) < self.threshold_s:
            return
        findings = self._diagnose(mine)
        text, waiting, gone = findings.text, findings.waiting, findings.gone
        if not findings.found:
            return
        self.report = text
        claim = f"{oldest.get('group')}/{oldest.get('seq')}"
        if waiting and min(waiting) != self.rank:
            return  # a lower waiting rank logs it
        if claim not in self._logged:
            self._logged.add(claim)
            self._gone_logged[claim] = set(gone)
            if self._first_in_job(claim):
                logger.error("ferrodist flight recorder: a collective is stuck\n%s", text)
            return
        # A rank whose heartbeat stopped after the first report (a host cut off or dead, a
        # frozen process) looked merely behind then; say once that it is gone now.
        new = sorted(set(gone) - self._gone_logged[claim])
        if not new:
            return
        self._gone_logged[claim].update(new)
        if self._first_in_job(f"{claim}/gone/{','.join(map(str, new))}"):
            ranks = f"rank {new[0]}" if len(new) == 1 else f"ranks {', '.join(map(str, new))}"
            logger.error(
                "ferrodist flight recorder: the stuck collective's report changed: %s gone now "
                "(no heartbeat: a host down or cut off, or a frozen process)\n%s",
                f"{ranks} {'is' if len(new) == 1 else 'are'}",
                text,
            )

    def _first_in_job(self, what: str) -> bool:
        """Whether this rank is the first of the job to log ``what`` (the store's ``add`` makes
        it once per job even if two ranks think they should)."""
        with self._lock:
            return bool(self._store.add(f"{KEY_PREFIX}logged/{what}", 1) == 1)

    def diagnose(self, mine: Optional[str] = None) -> tuple[str, bool, list[int]]:
        """(report text, whether it found anything, the ranks waiting in an op), from every
        rank's published summary."""
        findings = self._diagnose(mine)
        return findings.text, findings.found, findings.waiting

    def _diagnose(self, mine: Optional[str] = None) -> _Findings:
        """``diagnose``'s answer, the ranks found gone, whether a desync was, and how long this
        rank's oldest pending op has waited."""
        rec = _recorder.recorder()
        if rec is None:
            return _Findings("", False, [], [], False, 0.0)
        if mine is None:
            mine = self.publish()
        summaries = [mine]
        exited: list[tuple[int, int]] = []
        for r in range(self.world_size):
            if r == self.rank:
                continue
            key = f"{KEY_PREFIX}{r}"
            with self._lock:
                if not self._store.check([key]):
                    continue
                raw = self._store.get(key)
            text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            summaries.append(self._age_if_dead(text, exited))
        text, report = _native.flight_diagnose(summaries, self.world_size, self.heartbeat_timeout_s)
        parsed = json.loads(report)
        found = any(parsed.get(k) for k in ("behind", "desyncs", "gone"))
        for rank, pid in exited:
            text += f"\nrank {rank}: its process (pid {pid} on {self._host}) has exited"
        waiting = sorted({r for b in parsed.get("behind") or [] for r in b.get("waiting") or []})
        if not waiting:  # a desync or a gone rank alone: the ranks with an op pending
            waiting = sorted(s["rank"] for s in map(json.loads, summaries) if s.get("pending"))
        gone = sorted({g["rank"] for g in parsed.get("gone") or []})
        pending = json.loads(mine).get("pending") or []
        waited_s = _waited_s(pending[0]) if pending else 0.0
        return _Findings(text, found, waiting, gone, bool(parsed.get("desyncs")), waited_s)

    def _age_if_dead(self, summary: str, exited: list[tuple[int, int]]) -> str:
        """``summary``, with its heartbeat made older than the timeout when it names a process
        of this host that no longer exists: a dead rank is gone now, not once its heartbeat
        ages (its ops stay in the diagnosis: what it last did is what the reader wants)."""
        try:
            parsed = json.loads(summary)
        except ValueError:
            return summary
        pid = parsed.get("pid")
        if parsed.get("host") != self._host or not isinstance(pid, int) or _process_exists(pid):
            return summary
        exited.append((parsed.get("rank"), pid))
        stale = int(time.time() * 1000 - self.heartbeat_timeout_s * 1000) - 1
        parsed["heartbeat_ms"] = min(parsed.get("heartbeat_ms") or stale, stale)
        return json.dumps(parsed)

    def on_failure(self, error: BaseException) -> Optional[str]:
        """The report to attach to a failed op's error: the kept one, else a fresh diagnosis."""
        if not isinstance(error, RuntimeError):
            return None
        _dump.dump_quietly(f"failed: {_recorder.short(error)}")
        if self.report:
            return self.report
        # A peer that died makes this op fail while the kernel is still tearing the process
        # down (its sockets close before it is a zombie): look again for a moment.
        for attempt in range(4):
            findings = self._diagnose()
            if findings.found and self._explains_failure(findings):
                return findings.text
            if attempt < 3:
                time.sleep(0.25)
        return None

    def _explains_failure(self, findings: _Findings) -> bool:
        """Whether a diagnosis may be attached to a failed op's error. A gone rank or a desync
        is seen at once. Ranks "behind" are read from summaries published once a period, so
        they only mean something once the op has waited as long as a hang must (the
        threshold): an op that fails at once (torch 2.4's gloo refuses ``ReduceOp.AVG`` on
        every rank when waited for) would otherwise name peers that were merely not yet seen
        issuing it."""
        return bool(findings.gone) or findings.desynced or findings.waited_s >= self.threshold_s


class _Current:
    watchdog: Optional[Watchdog] = None
    atexit_registered = False


def start(store: Any, rank: int, world_size: int, group_timeout: timedelta) -> Optional[Watchdog]:
    """Start the watchdog for the default group (nothing when recording is off)."""
    stop()
    if _recorder.recorder() is None or store is None:
        return None
    threshold = threshold_from_env(group_timeout)
    period = min(5.0, max(0.1, threshold / 4))
    try:
        dog = Watchdog(store, rank, world_size, threshold, period)
        dog.start()
    except Exception as e:  # diagnosing hangs is not worth failing the job's start
        logger.warning("ferrodist flight recorder: the hang watchdog did not start: %s", e)
        return None
    _Current.watchdog = dog
    _recorder._State.on_failure = dog.on_failure
    if not _Current.atexit_registered:
        atexit.register(stop)
        _Current.atexit_registered = True
    return dog


def stop() -> None:
    """Stop and join the watchdog, if one runs, and release the works the recorder holds."""
    dog = _Current.watchdog
    _Current.watchdog = None
    _recorder._State.on_failure = None
    if dog is not None:
        dog.stop()
    _recorder.forget_in_flight()


def last_report() -> Optional[str]:
    dog = _Current.watchdog
    return None if dog is None else dog.report


def _forget_after_fork() -> None:
    """In a forked child the thread does not exist: forget it (its fds are the parent's)."""
    dog = _Current.watchdog
    _Current.watchdog = None
    _recorder._State.on_failure = None
    if dog is not None and dog._signal_fd:
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            pass


os.register_at_fork(after_in_child=_forget_after_fork)
