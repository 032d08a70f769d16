"""Worker checks for ``ZeroRedundancyOptimizer.overlap_with_forward``, run in real gloo worlds
by test_zero_overlap.py.

Every check trains ferrodist's ZeRO with the overlap on beside torch's ZeRO (synchronous) on
the same rank-local data and compares parameters bit for bit, reading them only through a path
the overlap's contract covers: a module's forward (checked per module, inside the forward), the
model's ``state_dict()``, the optimizer's ``consolidate_state_dict``/``state_dict``, the next
``step()``, ``wait_for_params()``, and parameters no hooked module holds (updated by ``step()``).
Each check runs twice: with gloo's broadcasts, and with broadcasts whose result lands only when
waited for (so that a read the overlap forgot to wait for is caught, not hidden by loopback).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from _world_end import end_world
from _zero_workers import (
    OPTIMIZERS,
    assert_state_dicts_equal,
    backward,
    init_world,
    make_model,
    param_groups,
)
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import ferrodist.optim as fopt
import ferrodist.optim.zero_redundancy_optimizer as zro
from ferrodist.nn import DistributedDataParallel as FerroDDP

LINEARS = (0, 2, 4)  # indexes of make_model()'s Linear layers


def _same_params(ours: nn.Module, theirs: nn.Module, what: str) -> None:
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(p, q), (what, name)


def _forward_checked(
    ours_model: nn.Module, theirs_model: nn.Module, zero: Any, expect_overlap: bool, what: str
) -> None:
    """A forward of ours in which each Linear, as it begins, must see torch's parameters; at the
    first Linear the last one's broadcasts must not have been waited for yet."""
    seen: list[int] = []

    def probe(index: int) -> Any:
        def hook(module: nn.Module, _args: Any) -> None:
            seen.append(index)
            for p, q in zip(module.parameters(), theirs_model[index].parameters()):
                assert torch.equal(p, q), (what, index)
            pending = zero._forward_overlap.pending_params()
            assert not any(p in pending for p in module.parameters()), (what, index)
            if index == LINEARS[0] and expect_overlap:
                last = list(ours_model[LINEARS[-1]].parameters())
                assert all(p in pending for p in last), (what, "last module already waited")

        return hook

    # Registered after the overlap's hooks (which are prepended), so they see what the layer
    # itself will compute with.
    handles = [ours_model[i].register_forward_pre_hook(probe(i)) for i in LINEARS]
    with torch.no_grad():
        ours_model(torch.randn(2, 7))
    for h in handles:
        h.remove()
    assert seen == list(LINEARS), seen
    assert not zero._forward_overlap.pending_params(), what


def _step_both(pairs: list[tuple[nn.Module, Any]], rank: int, step: int) -> None:
    for model, opt in pairs:
        backward(model, seed=100 * rank + step)  # rank-local gradients; ours' forward waits
        opt.step()


def check_parity_and_access_paths(rank: int, world: int) -> None:
    to = world - 1
    for name, (cls, kwargs) in OPTIMIZERS.items():
        for bucket_view in (False, True):
            what = (name, bucket_view, world)
            ours_model, theirs_model = make_model(), make_model()
            ours = fopt.ZeroRedundancyOptimizer(
                param_groups(ours_model), cls, parameters_as_bucket_view=bucket_view, **kwargs
            )
            theirs = TorchZero(
                param_groups(theirs_model), cls, parameters_as_bucket_view=bucket_view, **kwargs
            )
            handle = ours.overlap_with_forward(ours_model)
            pairs = [(ours_model, ours), (theirs_model, theirs)]
            for step in range(3):
                _step_both(pairs, rank, step)
            # 1. the next forward, module by module (the overlap is real without bucket view:
            # with it, a rank's one bucket carries the first and the last layer alike).
            _forward_checked(ours_model, theirs_model, ours, not bucket_view, what)
            # 2. two steps with no forward between: the second waits for the first's broadcasts
            # before stepping (the owner's broadcast still reads what it would write).
            ours.step(), theirs.step()
            assert ours._forward_overlap.pending_params(), what
            first = list(ours._forward_overlap._in_flight)
            ours.step(), theirs.step()
            assert first and all(pending.done for pending in first), what
            # 3. the model's state dict.
            state = ours_model.state_dict()
            for (key, value), q in zip(state.items(), theirs_model.parameters()):
                assert torch.equal(value, q), (what, key)
            # 4. consolidation (then the parameters may be read directly).
            _step_both(pairs, rank, 10)
            ours.step(), theirs.step()
            ours.consolidate_state_dict(to=to)
            theirs.consolidate_state_dict(to=to)
            _same_params(ours_model, theirs_model, f"{what} consolidate")
            if rank == to:
                assert_state_dicts_equal(ours.state_dict(), theirs.state_dict())
            # 5. wait_for_params().
            _step_both(pairs, rank, 11)
            ours.step(), theirs.step()
            # zero_grad() touches only gradients, which no broadcast writes: it leaves the
            # broadcasts in flight (waiting there would undo the overlap in a torch loop).
            ours.zero_grad(), theirs.zero_grad()
            assert ours._forward_overlap.pending_params(), what
            ours.wait_for_params()
            _same_params(ours_model, theirs_model, f"{what} wait_for_params")
            # 6. removed: step() is synchronous again.
            _step_both(pairs, rank, 12)
            handle.remove()
            assert ours._forward_overlap is None
            _same_params(ours_model, theirs_model, f"{what} removed")
            _step_both(pairs, rank, 13)
            _same_params(ours_model, theirs_model, f"{what} sync again")


def check_unhooked_params(rank: int, world: int) -> None:
    """A parameter of the optimizer that no module of the hooked tree holds is updated when
    ``step()`` returns, as without the overlap."""
    for bucket_view in (False, True):
        setups = []
        for zero_cls in (fopt.ZeroRedundancyOptimizer, TorchZero):
            model = make_model()
            torch.manual_seed(1)
            extra = nn.Parameter(torch.randn(40))  # in a bucket view it shares a rank's bucket
            opt = zero_cls(
                [*model.parameters(), extra],
                torch.optim.Adam,
                parameters_as_bucket_view=bucket_view,
                lr=0.01,
            )
            setups.append((model, extra, opt))
        setups[0][2].overlap_with_forward(setups[0][0])
        for step in range(2):
            for model, extra, opt in setups:
                backward(model, seed=100 * rank + step)
                extra.grad = torch.full_like(extra, 0.1 * (rank + 1 + step))
                opt.step()
            assert torch.equal(setups[0][1], setups[1][1]), (bucket_view, step)
        setups[0][2].wait_for_params()
        _same_params(setups[0][0], setups[1][0], f"unhooked {bucket_view}")


def check_with_ddp(rank: int, world: int) -> None:
    """The README's loop: ferrodist's DDP + ZeRO with the overlap, against torch's DDP + ZeRO."""
    ours_model, theirs_model = make_model(), make_model()
    ours_ddp, theirs_ddp = FerroDDP(ours_model), TorchDDP(theirs_model)
    ours = fopt.ZeroRedundancyOptimizer(ours_ddp.parameters(), torch.optim.AdamW, lr=0.01)
    theirs = TorchZero(theirs_ddp.parameters(), torch.optim.AdamW, lr=0.01)
    ours.overlap_with_forward(ours_ddp)
    for step in range(3):
        _step_both([(ours_ddp, ours), (theirs_ddp, theirs)], rank, step)
    _forward_checked(ours_model, theirs_model, ours, True, "ddp")


def check_refusals(rank: int, world: int) -> None:
    model = make_model()
    zero = fopt.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    handle = zero.overlap_with_forward(model)
    try:
        zero.overlap_with_forward(model)
    except RuntimeError as err:
        assert "already on" in str(err)
    else:
        raise AssertionError("a second overlap_with_forward must raise")
    handle.remove()
    zero.overlap_with_forward(model).remove()
    overlapped = fopt.ZeroRedundancyOptimizer(
        model.parameters(), torch.optim.SGD, overlap_with_ddp=True, lr=0.1
    )
    try:
        overlapped.overlap_with_forward(model)
    except RuntimeError as err:
        assert "overlap_with_ddp" in str(err)
    else:
        raise AssertionError("overlap_with_forward with overlap_with_ddp must raise")


class _LateWork:
    """A broadcast whose result reaches its tensor only when it is waited for.

    Over loopback a real broadcast has usually landed before the forward gets to the layer,
    so a missing wait would go unseen; with these, every read the contract covers must have
    been preceded by a wait, or it sees the old value and the parity checks fail.
    """

    def __init__(self, tensor: torch.Tensor, **kwargs: Any) -> None:
        self.tensor = tensor
        self.buffer = tensor.detach().clone()
        self.work = _REAL_BROADCAST(self.buffer, **kwargs)

    def wait(self) -> bool:
        self.work.wait()
        with torch.no_grad():
            self.tensor.copy_(self.buffer)
        return True


_REAL_BROADCAST = zro._broadcast


@contextlib.contextmanager
def late_delivery() -> Iterator[None]:
    zro._broadcast = _LateWork  # type: ignore[assignment]
    try:
        yield
    finally:
        zro._broadcast = _REAL_BROADCAST


def run_world(rank: int, world: int, tmp: str) -> None:
    init_world(rank, world, tmp)
    try:
        check_refusals(rank, world)
        for strict in (False, True):
            with late_delivery() if strict else contextlib.nullcontext():
                check_parity_and_access_paths(rank, world)
                check_unhooked_params(rank, world)
                check_with_ddp(rank, world)
    finally:
        end_world()
