"""The errors DDP records in its logging data (``has_error``, ``error``), against torch's DDP.

torch's DDP records an error it raises itself (a comm hook its checks refuse, a bad logging
sample rate, pickling over a group other than the default one) as ``"<class 'X'>: message"``
before raising it; an error a hook causes inside backward is raised but not recorded. torch's
own ``test_ddp_invalid_comm_hook_return_type`` reads the record after a refused return
annotation, then registers a hook that returns no Future and expects backward to raise. Each
scenario here runs against torch's DDP and ferrodist's in a one-rank gloo group and compares the
error raised and what the logging data holds afterwards.

No ``from __future__ import annotations`` here: torch's checks compare the hooks' annotations
with real classes, and would refuse strings.
"""

import copy
from collections.abc import Iterator
from typing import Any, Callable, Optional

import pytest
import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ferrodist.nn import DistributedDataParallel as FerroDDP

_Outcome = tuple[Optional[type], str, dict[str, Any], list[str]]


@pytest.fixture
def world() -> Iterator[None]:
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    try:
        yield None
    finally:
        tdist.destroy_process_group()


def _recorded(ddp: Any) -> dict[str, Any]:
    data = ddp._get_ddp_logging_data()
    return {key: data[key] for key in ("has_error", "error") if key in data}


def _outcome(ddp: Any, action: Callable[[Any], object]) -> _Outcome:
    """The error ``action(ddp)`` raised (class, message), the error record afterwards and the
    logging data's keys that ``action`` added."""
    before = set(ddp._get_ddp_logging_data())
    error: Optional[Exception] = None
    try:
        action(ddp)
    except Exception as e:  # the scenario under test decides which
        error = e
    added = sorted(set(ddp._get_ddp_logging_data()) - before)
    return type(error) if error else None, str(error or ""), _recorded(ddp), added


def _train_step(ddp: Any) -> None:
    ddp(torch.randn(3, 4)).sum().backward()


def _returns_an_int(state: object, bucket: tdist.GradBucket):  # type: ignore[no-untyped-def]
    return 1  # no annotation: torch's checks pass it, backward fails on it


def _annotated_int(state: object, bucket: tdist.GradBucket) -> int:
    raise AssertionError("never called: registration refuses it")


def _bucket_annotated_int(state: object, bucket: int) -> torch.futures.Future[torch.Tensor]:
    raise AssertionError("never called: registration refuses it")


def _register(hook: object) -> Callable[[Any], object]:
    return lambda ddp: ddp.register_comm_hook(None, hook)


SCENARIOS: dict[str, Callable[[Any], object]] = {
    "return annotation": _register(_annotated_int),
    "bucket annotation": _register(_bucket_annotated_int),
    "not callable": _register(3),
    "sample rate": lambda ddp: ddp._set_ddp_runtime_logging_sample_rate(0),
}


def _both(action: Callable[[Any], object]) -> tuple[_Outcome, _Outcome]:
    outcomes = []
    for ddp_class in (TorchDDP, FerroDDP):
        torch.manual_seed(0)
        outcomes.append(_outcome(ddp_class(torch.nn.Linear(4, 2)), action))
    return outcomes[0], outcomes[1]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_an_error_ddp_raises_itself_is_recorded_as_torch_records_it(
    world: None, scenario: str
) -> None:
    theirs, ours = _both(SCENARIOS[scenario])
    assert theirs[0] is not None and theirs[2]["has_error"] == 1
    assert theirs[2]["error"] == f"{theirs[0]}: {theirs[1]}"
    assert theirs[3] == ["error", "has_error"]
    assert ours == theirs


def test_torchs_invalid_return_type_scenario_records_the_refused_annotation(world: None) -> None:
    """torch's test: a refused return annotation is recorded; then a hook without annotations
    that returns an int is registered, and backward raises torch's RuntimeError, leaving the
    first record in place."""

    def scenario(ddp: Any) -> tuple[_Outcome, _Outcome]:
        refused = _outcome(ddp, SCENARIOS["return annotation"])
        ddp.register_comm_hook(None, _returns_an_int)
        return refused, _outcome(ddp, _train_step)

    outcomes = []
    for ddp_class in (TorchDDP, FerroDDP):
        torch.manual_seed(0)
        ddp = ddp_class(torch.nn.Linear(4, 2))
        outcomes.append(scenario(ddp))
        assert "iteration" in ddp._get_ddp_logging_data()
    (their_refusal, their_step), (our_refusal, our_step) = outcomes
    assert their_refusal[0] is ValueError
    assert "return annotation should be torch.futures.Future" in their_refusal[2]["error"]
    assert our_refusal == their_refusal
    assert their_step[0] is our_step[0] is RuntimeError
    # torch's message carries pybind11's cast failure in front of its own text
    expected = "callback must return a torch.futures.Future object, but got builtins.int"
    assert expected in our_step[1]
    assert their_step[1].endswith(our_step[1])
    assert our_step[2] == their_step[2] == their_refusal[2]


def test_a_hook_failing_in_backward_is_raised_not_recorded_as_in_torch(world: None) -> None:
    theirs, ours = _both(lambda ddp: (_register(_returns_an_int)(ddp), _train_step(ddp)))
    assert theirs[0] is ours[0] is RuntimeError
    assert theirs[1].endswith(ours[1])
    assert ours[2] == theirs[2] == {}
    assert ours[3] == theirs[3]


def test_pickling_over_another_group_is_recorded_as_torch_records_it(world: None) -> None:
    group = tdist.new_group([0])
    outcomes = []
    for ddp_class in (TorchDDP, FerroDDP):
        ddp = ddp_class(torch.nn.Linear(4, 2), process_group=group)
        outcomes.append(_outcome(ddp, copy.deepcopy))
    theirs, ours = outcomes
    assert theirs[0] is RuntimeError and theirs[2]["error"].startswith("<class 'RuntimeError'>: ")
    assert ours == theirs
