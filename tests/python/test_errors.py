"""ferrodist's errors are caught by the clauses a torch user already writes."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as tdist

import ferrodist
from ferrodist import errors

# torch 2.4 has no store queues, hence no QueueEmptyError of its own.
TORCH_QUEUE_EMPTY = getattr(tdist, "QueueEmptyError", tdist.DistStoreError)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (errors.DistError, tdist.DistError),
        (errors.DistStoreError, tdist.DistStoreError),
        (errors.DistNetworkError, tdist.DistNetworkError),
        (errors.DistBackendError, tdist.DistBackendError),
        (errors.QueueEmptyError, TORCH_QUEUE_EMPTY),
        (errors.StoreTimeoutError, tdist.DistStoreError),
        (errors.StoreTimeoutError, TimeoutError),
        (errors.ConnectionClosedError, tdist.DistNetworkError),
        (errors.ConnectionClosedError, ConnectionError),
        (errors.NetworkTimeoutError, tdist.DistNetworkError),
        (errors.NetworkTimeoutError, TimeoutError),
        (errors.DistError, RuntimeError),
    ],
)
def test_each_class_subclasses_the_torch_class(ours: type, theirs: type) -> None:
    assert issubclass(ours, theirs)
    assert issubclass(ours, errors.FerrodistError)


def test_timeout_is_a_dist_store_error_naming_keys_and_timeout() -> None:
    store = ferrodist.HashStore()
    store.set("present", "1")
    with pytest.raises(tdist.DistStoreError) as info:
        store.wait(["present", "absent"], timedelta(milliseconds=50))
    assert "absent" in str(info.value)
    assert "present" not in str(info.value)
    assert "50ms" in str(info.value)


def test_queue_empty_is_torchs_queue_empty_error() -> None:
    with pytest.raises(TORCH_QUEUE_EMPTY):
        ferrodist.HashStore().queue_pop("q", block=False)


@pytest.mark.parametrize("bad", [1, 2.5, None, ["k"]])
def test_wrong_key_type_is_a_type_error_naming_the_argument(bad: object) -> None:
    with pytest.raises(TypeError, match="key"):
        ferrodist.HashStore().set(bad, "v")  # type: ignore[arg-type]


def test_add_on_a_non_integer_is_a_value_error() -> None:
    store = ferrodist.HashStore()
    store.set("k", "abc")
    with pytest.raises(ValueError, match="k"):
        store.add("k", 1)


@pytest.mark.parametrize(
    "call",
    [
        lambda: ferrodist.HashStore().set(b"\xff", "v"),
        lambda: ferrodist.HashStore().wait(["k"], float("nan")),
        lambda: ferrodist.StoreCollectives(ferrodist.HashStore(), 2, 2),
        lambda: ferrodist.HashStore().multi_set(["a", "b"], ["1"]),
    ],
    ids=["non-utf8-key", "nan-timeout", "rank-outside-world", "multi-set-lengths"],
)
def test_every_value_error_from_the_native_layer_is_one_ferrodist_class(call: Any) -> None:
    with pytest.raises(ValueError) as info:
        call()
    assert isinstance(info.value, errors.InvalidArgumentError), type(info.value)
    assert isinstance(info.value, errors.FerrodistError)
    assert isinstance(info.value, RuntimeError), "torch's checks raise RuntimeError"


def test_collective_argument_errors_share_the_class_of_store_argument_errors() -> None:
    coll = ferrodist.StoreCollectives(ferrodist.HashStore(), 0, 1)
    coll.broadcast_send("k", b"x")
    with pytest.raises(errors.InvalidArgumentError, match="already been used"):
        coll.broadcast_send("k", b"x")
    assert errors.InvalidInputError is errors.InvalidArgumentError


class _UserStore(tdist.Store):
    """A user's Python store whose calls fail the way the test asks."""

    def __init__(self, error: BaseException, delay: float = 0.0) -> None:
        super().__init__()
        super().set_timeout(timedelta(milliseconds=100))
        self.error, self.delay = error, delay

    def _fail(self) -> Any:
        time.sleep(self.delay)
        raise self.error

    def set(self, key: str, value: Any) -> None:
        self._fail()

    def get(self, key: str) -> bytes:
        return self._fail()

    def wait(self, keys: Any, timeout: Any = None) -> None:
        self._fail()


def test_a_keyboard_interrupt_inside_a_users_store_propagates_as_itself() -> None:
    store = ferrodist.PrefixStore("p", _UserStore(KeyboardInterrupt("pressed in set")))
    with pytest.raises(KeyboardInterrupt, match="pressed in set"):
        store.set("k", "v")
    with pytest.raises(KeyboardInterrupt):
        ferrodist.StoreCollectives(store, 0, 2).broadcast_recv("b", timedelta(seconds=5))


def test_a_users_store_error_that_mentions_timeout_is_not_a_timeout_when_it_did_not_wait() -> None:
    failing = _UserStore(tdist.DistStoreError("cannot open /tmp/timeouts/store: Is a directory"))
    store = ferrodist.PrefixStore("p", failing)
    for call in (lambda: store.get("k"), lambda: store.wait(["k"], timedelta(seconds=5))):
        with pytest.raises(tdist.DistStoreError, match="Is a directory") as info:
            call()
        assert not isinstance(info.value, TimeoutError), info.value


def test_a_users_store_that_fails_after_its_timeout_timed_out_whatever_it_says() -> None:
    store = ferrodist.PrefixStore("p", _UserStore(tdist.DistStoreError("keys never came"), 0.12))
    with pytest.raises(errors.StoreTimeoutError):
        store.wait(["k"], timedelta(milliseconds=100))
    with pytest.raises(errors.StoreTimeoutError, match="keys never came"):
        store.get("k")


@pytest.mark.parametrize("kind", ["hash", "file", "tcp"])
def test_torchs_own_timeouts_through_the_adapter_are_timeouts(kind: str, tmp_path: Path) -> None:
    torch_store = {
        "hash": tdist.HashStore,
        "file": lambda: tdist.FileStore(str(tmp_path / "store"), 1),
        "tcp": lambda: tdist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10)),
    }[kind]()
    torch_store.set_timeout(timedelta(milliseconds=100))
    store = ferrodist.PrefixStore("p", torch_store)
    with pytest.raises(errors.StoreTimeoutError):
        store.get("never")
    with pytest.raises(errors.StoreTimeoutError):
        store.wait(["never"], timedelta(milliseconds=100))
    torch_store.set("p/n", "abc")
    with pytest.raises(ValueError) if kind == "hash" else pytest.raises(RuntimeError):
        store.add("n", 1)
