"""When an op is recorded against its launch: after it on CPU tensors (the recording overlaps the
backend's work), before it where the launch itself may block (a device's first op sets up its
communicator, waiting for every peer), so that a hang inside the launch is still on record."""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch

from ferrodist._recorded_ops import collective
from ferrodist.debug import _recorder


class _FakeWork:
    def __init__(self) -> None:
        self.waited = False

    def wait(self) -> bool:
        self.waited = True
        return True

    def is_completed(self) -> bool:
        return self.waited

    def get_future(self) -> Any:
        raise RuntimeError("no future")


@pytest.fixture
def rec() -> Any:
    recorder = _recorder.recorder()
    if recorder is None:
        pytest.skip("FERRODIST_FLIGHT_RECORDER=0 in this environment")
    return recorder


def _recorded_during_call(rec: Any, tensor: torch.Tensor, async_op: bool) -> tuple[list, Any]:
    """The op names the ring holds while the fake collective's launch runs, and its result."""
    seen: list[list[str]] = []
    marker = f"test.order.{tensor.device.type}.{async_op}"

    def fake(tensor: torch.Tensor, group: Optional[Any] = None, async_op: bool = False) -> Any:
        seen.append([e["op"] for e in rec.entries() if e["op"] == marker])
        return _FakeWork() if async_op else None

    recorded = collective(marker, fake, "tensor")
    result = recorded(tensor, async_op=async_op)
    entries = [e for e in rec.entries() if e["op"] == marker]
    assert len(entries) == 1, entries
    return [seen[0], entries[0]], result


@pytest.mark.parametrize("async_op", [False, True])
def test_an_op_on_cpu_tensors_is_recorded_after_its_launch(rec: Any, async_op: bool) -> None:
    (during, entry), result = _recorded_during_call(rec, torch.ones(2), async_op)
    assert during == []  # the launch ran first
    assert entry["shapes"] == [[2]] and entry["state"] in ("started", "completed")
    if async_op:
        assert isinstance(result, _FakeWork)
        result.wait()
        _recorder.waited(result)  # its issuer waited: completed, and no longer held
        assert [e["state"] for e in rec.entries() if e["id"] == entry["id"]] == ["completed"]
    else:  # made as the asynchronous call and its wait, returning what the sync call returns
        assert result is None and entry["state"] == "completed"


@pytest.mark.parametrize("async_op", [False, True])
def test_an_op_off_the_cpu_is_recorded_before_its_launch(rec: Any, async_op: bool) -> None:
    tensor = torch.empty(2, device="meta")  # not on the CPU, and runs anywhere
    (during, entry), _ = _recorded_during_call(rec, tensor, async_op)
    assert len(during) == 1  # on record while its launch ran
    assert entry["shapes"] == [[2]]


def test_a_synchronous_op_on_a_device_is_launched_asynchronously_then_waited(
    rec: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a device a synchronous call returns once its op is enqueued, so it is made as the
    asynchronous call and its wait, and the op stays pending until the device has run it (the
    CUDA path, checked here on a ``meta`` tensor taken for a device one)."""
    import ferrodist._recorded_ops as recorded_ops

    monkeypatch.setattr(recorded_ops, "_on_device", lambda tensors: True)
    calls: list[tuple[Any, bool]] = []
    works: list[_FakeWork] = []

    def fake(tensor: torch.Tensor, group: Optional[Any] = None, async_op: bool = False) -> Any:
        calls.append((tensor, async_op))
        works.append(_FakeWork())
        return works[-1]

    tensor = torch.empty(2, device="meta")
    marker = "test.order.device.sync"
    assert collective(marker, fake, "tensor")(tensor) is None  # what the synchronous call returns
    assert len(calls) == 1 and calls[0][0] is tensor and calls[0][1] is True
    assert works[0].waited
    _recorder.waited(works[0])  # held until the device is done: here, its work says so
    states = [e["state"] for e in rec.entries() if e["op"] == marker]
    assert states == ["completed"], states
