"""StoreCollectives against torch's ``_StoreCollectives``: results, key layout, timeouts.

The property test draws a world size, a script of collectives and, per rank, whether that rank
runs torch's class or ferrodist's. All ranks share one store that records every key written;
the results and the final store contents must equal those of an all-torch run.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Callable

import pytest
import torch.distributed as tdist
from _delegating_store import DelegatingStore
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ferrodist
from ferrodist import StoreCollectives

TORCH_HAS_STORE_COLLECTIVES = hasattr(tdist, "_StoreCollectives")
needs_torchs = pytest.mark.skipif(
    not TORCH_HAS_STORE_COLLECTIVES,
    reason="this torch has no _StoreCollectives to compare with (2.15 removed it)",
)

LONG = timedelta(seconds=20)
SHORT = timedelta(milliseconds=100)


class RecordingStore(DelegatingStore):
    """A torch store (over torch's HashStore) that remembers every key written."""

    def __init__(self) -> None:
        super().__init__(tdist.HashStore())
        self.written: set[str] = set()
        self._lock = threading.Lock()

    def _note(self, *keys: str) -> None:
        with self._lock:
            self.written.update(keys)

    def set(self, key: str, value: Any) -> None:
        self._note(key)
        super().set(key, value)

    def add(self, key: str, value: int) -> int:
        self._note(key)
        return super().add(key, value)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._note(*keys)
        super().multi_set(keys, values)

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)

    def contents(self) -> dict[str, bytes]:
        return {k: self.inner.get(k) for k in sorted(self.written)}


OPS = ["barrier", "broadcast", "gather", "scatter", "all_gather", "all_sum"]
Step = tuple[str, int, int]  # (op, root, payload seed)
Case = tuple[int, list[Step], list[bool]]


def run_step(c: Any, rank: int, world: int, step: Step, key: str) -> object:
    op, root, seed = step
    root %= world
    text = f"{op}-{seed}-{rank}"
    payload: str | bytes = text if seed % 2 else text.encode() + bytes([seed % 256, 0])
    if op == "barrier":
        return c.barrier(key, LONG)
    if op == "broadcast":
        return c.broadcast_send(key, payload, LONG) if rank == root else c.broadcast_recv(key, LONG)
    if op == "gather":
        if rank == root:
            return c.gather_recv(key, payload, LONG)
        return c.gather_send(key, payload, LONG)
    if op == "scatter":
        if rank == root:
            return c.scatter_send(key, [f"{seed}-to-{i}" for i in range(world)], LONG)
        return c.scatter_recv(key, LONG)
    if op == "all_gather":
        return c.all_gather(key, payload, LONG)
    return c.all_sum(key, seed * (rank + 1) - 7, LONG)


def run_world(
    world: int, steps: list[Step], uses_torch: list[bool]
) -> tuple[list[list[object]], dict[str, bytes]]:
    store = RecordingStore()
    results: list[list[object]] = [[] for _ in range(world)]
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        cls: Callable[..., Any] = tdist._StoreCollectives if uses_torch[rank] else StoreCollectives
        c = cls(store, rank, world)
        try:
            for n, step in enumerate(steps):
                results[rank].append(run_step(c, rank, world, step, f"k{n}"))
        except BaseException as err:  # reported below, with the rank
            errors.append(err)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results, store.contents()


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 5).flatmap(
        lambda world: st.tuples(
            st.just(world),
            st.lists(
                st.tuples(st.sampled_from(OPS), st.integers(0, 4), st.integers(0, 1000)),
                min_size=1,
                max_size=4,
            ),
            st.lists(st.booleans(), min_size=world, max_size=world),
        )
    )
)
@pytest.mark.timeout(300)
@needs_torchs
def test_mixed_torch_and_ferrodist_ranks_match_torch(case: Case) -> None:
    world, steps, uses_torch = case
    expected = run_world(world, steps, [True] * world)
    assert run_world(world, steps, uses_torch) == expected
    assert run_world(world, steps, [False] * world) == expected


@pytest.mark.parametrize("make_store", [ferrodist.HashStore, tdist.HashStore])
@pytest.mark.parametrize(
    ("op", "text"),
    [
        ("barrier", "barrier failed -- missing ranks: 0, 2, 3, wait timeout after 100ms"),
        ("gather", "gather failed -- missing ranks: 0, 2, 3, wait timeout after 100ms"),
        ("all_gather", "all_gather failed -- missing ranks: 0, 2, 3, wait timeout after 100ms"),
        ("all_sum", "barrier failed -- missing ranks: 0, 2, 3, wait timeout after 100ms"),
    ],
)
def test_timeout_names_missing_ranks_like_torch(
    make_store: Callable[[], tdist.Store], op: str, text: str
) -> None:
    c = StoreCollectives(make_store(), 1, 4)
    call = {
        "barrier": lambda: c.barrier("k", SHORT),
        "gather": lambda: c.gather_recv("k", b"x", SHORT),
        "all_gather": lambda: c.all_gather("k", b"x", SHORT),
        "all_sum": lambda: c.all_sum("k", 1, SHORT),
    }[op]
    started = time.monotonic()
    with pytest.raises(tdist.DistStoreError) as raised:
        call()
    assert time.monotonic() - started < 5
    assert str(raised.value).startswith(text)
    assert isinstance(raised.value, RuntimeError)
    if not TORCH_HAS_STORE_COLLECTIVES:
        return
    # torch's own class gives the same prefix on the same situation
    theirs = tdist._StoreCollectives(tdist.HashStore(), 1, 4)
    torch_call = {
        "barrier": lambda: theirs.barrier("k", SHORT),
        "gather": lambda: theirs.gather_recv("k", b"x", SHORT),
        "all_gather": lambda: theirs.all_gather("k", b"x", SHORT),
        "all_sum": lambda: theirs.all_sum("k", 1, SHORT),
    }[op]
    with pytest.raises(RuntimeError, match=text.split(", wait")[0]):
        torch_call()


def test_receive_timeouts_are_store_errors() -> None:
    c = StoreCollectives(ferrodist.HashStore(), 1, 2)
    with pytest.raises(tdist.DistStoreError, match="timeout"):
        c.broadcast_recv("b", SHORT)
    with pytest.raises(tdist.DistStoreError, match="timeout"):
        c.scatter_recv("s", 0.1)


def test_reused_key_raises_like_torch() -> None:
    both = [StoreCollectives(ferrodist.HashStore(), 0, 1)]
    if TORCH_HAS_STORE_COLLECTIVES:
        both.append(tdist._StoreCollectives(tdist.HashStore(), 0, 1))
    for c in both:
        c.broadcast_send("foo", b"x")
        with pytest.raises(RuntimeError, match="Key foo has already been used"):
            c.all_gather("foo", b"y")
        c.all_sum("s", 1)
        with pytest.raises(RuntimeError, match="Key s/barrier has already been used"):
            c.barrier("s/barrier")


class LateStore(RecordingStore):
    """Every wait times out, but the awaited keys appear just as it does: the worst race."""

    def __init__(self, late: dict[str, bytes]) -> None:
        super().__init__()
        self.late = late

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        # A real timeout comes once the timeout has passed (ferrodist tells a store's timeout
        # from its other failures by that, not by the message).
        time.sleep(timeout.total_seconds() if timeout is not None else 0.0)
        for key in keys:
            if key in self.late:
                self.inner.set(key, self.late[key])
        raise tdist.DistStoreError("wait timeout after 1ms")


def test_late_arrival_at_timeout_counts() -> None:
    store = LateStore({"ag/0": b"a", "ag/2": b"c"})
    c = StoreCollectives(store, 1, 3)
    assert c.all_gather("ag", b"b", SHORT) == [b"a", b"b", b"c"]


def test_only_ranks_still_missing_are_named() -> None:
    store = LateStore({"ag/0": b"a"})
    c = StoreCollectives(store, 1, 3)
    with pytest.raises(tdist.DistStoreError, match=r"missing ranks: 2, wait timeout"):
        c.all_gather("ag", b"b", SHORT)


def test_arguments_are_checked() -> None:
    store = ferrodist.HashStore()
    with pytest.raises(ValueError, match="rank"):
        StoreCollectives(store, 4, 4)
    with pytest.raises(TypeError, match="store"):
        StoreCollectives(object(), 0, 1)  # type: ignore[arg-type]
    c = StoreCollectives(store, 0, 3)
    with pytest.raises(ValueError, match="one entry per rank"):
        c.scatter_send("s", [b"a", b"b"])
    assert c.rank == 0 and c.world_size == 3


def test_str_data_comes_back_as_utf8_bytes() -> None:
    c = StoreCollectives(ferrodist.HashStore(), 0, 1)
    assert c.all_gather("u", "héllo") == ["héllo".encode()]


class SlowWriteStore(RecordingStore):
    """A store whose writes take ``delay`` seconds (a hung server, a slow disk)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def set(self, key: str, value: Any) -> None:
        time.sleep(self.delay)
        super().set(key, value)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        time.sleep(self.delay)
        for key, value in zip(keys, values):
            super().set(key, value)


@pytest.mark.parametrize(
    "send",
    [
        lambda c: c.broadcast_send("b", b"x", SHORT),
        lambda c: c.gather_send("g", b"x", SHORT),
        lambda c: c.scatter_send("s", [b"0", b"1"], SHORT),
    ],
    ids=["broadcast_send", "gather_send", "scatter_send"],
)
def test_a_send_honours_its_timeout(send: Callable[[Any], Any]) -> None:
    # torch bounds each store operation of a send by the timeout; ferrodist ignored it.
    coll = StoreCollectives(SlowWriteStore(delay=2.0), 1, 2)
    started = time.monotonic()
    with pytest.raises(ferrodist.StoreTimeoutError, match="did not take the write"):
        send(coll)
    assert time.monotonic() - started < 1.5


def test_a_send_within_its_timeout_succeeds_on_a_slow_store() -> None:
    store = SlowWriteStore(delay=0.05)
    StoreCollectives(store, 0, 2).broadcast_send("b", b"x", timedelta(seconds=5))
    assert store.inner.get("b") == b"x"
