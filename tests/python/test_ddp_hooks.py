"""GradBucket, the built-in hook enum and the comm-hook checks, without a process group."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import ferrodist
from ferrodist.algorithms.ddp_comm_hooks import default_hooks
from ferrodist.ddp.comm_hook import check_comm_hook


class _Stub:
    """Stands in for a torch DDP instance so its ``_check_comm_hook`` can run alone."""

    def _log_and_throw(self, err_type: type, msg: str) -> None:
        raise err_type(msg)


def _bucket(index: int = 0, count: int = 2) -> ferrodist.GradBucket:
    a, b = torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(4))
    buffer = torch.arange(10, dtype=torch.float32)
    return ferrodist.GradBucket(index, count, buffer, [0, 6], [6, 4], [a.shape, b.shape], [a, b])


def test_grad_bucket_views_follow_the_buffer() -> None:
    bucket = _bucket()
    grads = bucket.gradients()
    assert [g.shape for g in grads] == [torch.Size([2, 3]), torch.Size([4])]
    assert grads[1].tolist() == [6.0, 7.0, 8.0, 9.0]
    grads[0].fill_(-1)
    assert bucket.buffer()[:6].eq(-1).all()
    bucket.set_buffer(torch.ones(10, dtype=torch.float16))
    assert bucket.gradients()[1].dtype == torch.float16
    assert [p.shape for p in bucket.parameters()] == [torch.Size([2, 3]), torch.Size([4])]


def test_is_last_is_the_highest_index() -> None:
    assert not _bucket(0, 2).is_last()
    assert _bucket(1, 2).is_last() and _bucket(1, 2).index() == 1


def test_builtin_hook_type_matches_torch() -> None:
    for name in ("ALLREDUCE", "FP16_COMPRESS"):
        ours, theirs = (
            getattr(ferrodist.BuiltinCommHookType, name),
            getattr(tdist.BuiltinCommHookType, name),
        )
        assert int(ours) == int(theirs)
        assert str(ours) == str(theirs)
    assert len(ferrodist.BuiltinCommHookType) == 2


def test_hook_checks_raise_torchs_errors() -> None:
    with pytest.raises(TypeError, match="must be callable"):
        check_comm_hook(3)
    with pytest.raises(KeyError):
        check_comm_hook(lambda state, b: None)

    def wrong_bucket(state: object, bucket: int) -> torch.futures.Future[torch.Tensor]:
        raise AssertionError

    wrong_bucket.__annotations__["bucket"] = int
    with pytest.raises(ValueError, match="bucket annotation"):
        check_comm_hook(wrong_bucket)
    check_comm_hook(default_hooks.allreduce_hook)
    check_comm_hook(default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook))
    # bf16 needs CUDA 11+ and NCCL 2.10+ in the torch build: ours says yes/no where torch does
    torch_error = ours_error = None
    try:
        TorchDDP._check_comm_hook(_Stub(), default_hooks.bf16_compress_hook)  # type: ignore[arg-type]
    except TypeError as e:
        torch_error = str(e)
    try:
        check_comm_hook(default_hooks.bf16_compress_hook)
    except TypeError as e:
        ours_error = str(e)
    assert ours_error == torch_error


def test_our_hooks_pass_torchs_own_check() -> None:
    """torch's DDP inspects annotations; ferrodist's hooks must pass its check unchanged."""
    for hook in (
        default_hooks.allreduce_hook,
        default_hooks.fp16_compress_hook,
        default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook),
    ):
        TorchDDP._check_comm_hook(_Stub(), hook)  # type: ignore[arg-type]


def test_compress_hooks_math_on_one_rank() -> None:
    store = tdist.HashStore()
    tdist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        bucket = _bucket()
        expected = bucket.buffer().to(torch.bfloat16).float()
        out = default_hooks.bf16_compress_hook(None, bucket).wait()
        assert out.dtype == torch.float32 and torch.equal(out, expected)
        bucket = _bucket()
        wrapped = default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook)
        out = wrapped(None, bucket).wait()
        assert out.dtype == torch.float16
        assert torch.equal(out.float(), torch.arange(10, dtype=torch.float32))
    finally:
        tdist.destroy_process_group()
