"""Ctrl-C ends a HashStore call blocked in get, wait, multi_get or a blocking queue_pop within
about one poll interval, and the store carries on (no wait is left registered)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Callable

import pytest
from _procs import ctrl_c_after

import ferrodist

CALLS: dict[str, Callable[[ferrodist.HashStore], object]] = {
    "get": lambda s: s.get("never"),
    "wait": lambda s: s.wait(["never"]),
    "multi_get": lambda s: s.multi_get(["here", "never"]),
    "queue_pop": lambda s: s.queue_pop("empty", block=True),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_ctrl_c_interrupts_a_blocked_call_and_the_store_stays_usable(call: str) -> None:
    store = ferrodist.HashStore()
    store.set_timeout(timedelta(seconds=30))
    store.set("here", "1")
    with ctrl_c_after(0.3):
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            CALLS[call](store)
        assert time.monotonic() - started < 3
    store.set("never", "now")
    assert store.get("never") == b"now"
    store.queue_push("empty", "x")
    assert store.queue_pop("empty", block=True) == b"x"
