"""ferrodist's errors are caught by the clauses a torch user already writes."""

from __future__ import annotations

from datetime import timedelta

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
