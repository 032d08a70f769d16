"""Communication hooks: the built-in ones and the checks on user hooks.

A hook is ``hook(state, bucket) -> torch.futures.Future[torch.Tensor]``. The Reducer calls the
registered hook once per bucket, as soon as the bucket's last gradient is ready; with no hook it
runs a plain sum all-reduce (the gradients were already divided by the world size while being
copied into the bucket, as torch does). One hook per Reducer, registered before training.
"""

from __future__ import annotations

import enum
import inspect
from typing import Any, Callable, NoReturn

import torch
import torch.distributed as tdist

from ferrodist import ops
from ferrodist._recorded_ops import collective
from ferrodist.ddp.grad_bucket import GradBucket

CommHook = Callable[[Any, GradBucket], "torch.futures.Future[torch.Tensor]"]
Fail = Callable[[type[Exception], str], NoReturn]
"""Raises an error of the given class with the given message (and may record it first)."""

ddp_all_reduce = collective("ddp.all_reduce", ops._all_reduce, "tensor", "op")
"""``all_reduce`` recorded as DDP's traffic (the Reducer's and the default hooks'); a sparse
gradient on gloo takes ferrodist's own reduction (``ferrodist._sparse_all_reduce``)."""


class BuiltinCommHookType(enum.Enum):
    """Hooks the Reducer runs without calling into user Python (torch's enum, same values)."""

    ALLREDUCE = 1
    FP16_COMPRESS = 2

    def __int__(self) -> int:
        return int(self.value)

    def __str__(self) -> str:
        return f"BuiltinCommHookType.{self.name}"


def allreduce_sum_future(
    process_group: Any, tensor: torch.Tensor
) -> torch.futures.Future[torch.Tensor]:
    """Start a SUM all-reduce of ``tensor`` in place; the future yields ``tensor``."""
    work = ddp_all_reduce(tensor, group=process_group, async_op=True)
    assert work is not None
    return work.get_future().then(lambda fut: fut.value()[0])


def builtin_allreduce(process_group: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """``ALLREDUCE``: divide by the group size, then sum."""
    buffer = bucket.buffer()
    buffer.div_(process_group.size())
    return allreduce_sum_future(process_group, buffer)


def builtin_fp16_compress(
    process_group: Any, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """``FP16_COMPRESS``: sum a float16 copy divided by the group size, copy the result back."""
    buffer = bucket.buffer()
    compressed = buffer.to(torch.float16).div_(process_group.size())

    def decompress(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        buffer.copy_(fut.value())
        return buffer

    return allreduce_sum_future(process_group, compressed).then(decompress)


def resolve_builtin(comm_hook_type: Any) -> BuiltinCommHookType | None:
    """Map ours or torch's ``BuiltinCommHookType`` to ours; ``None`` when unknown."""
    try:
        return BuiltinCommHookType(int(comm_hook_type))
    except (TypeError, ValueError):
        return None


def _raise(err_type: type[Exception], message: str) -> NoReturn:
    raise err_type(message)


def check_comm_hook(hook: Any, fail: Fail = _raise) -> None:
    """Validate a user hook the way torch's ``DistributedDataParallel._check_comm_hook`` does.

    Args:
        hook: the hook to check.
        fail: called with the error class and message of the first check that fails; it must
            raise. DDP passes its ``_log_and_throw``, which first records the error in the
            logging data, as torch's DDP does; the default only raises.
    """
    if not callable(hook):
        fail(TypeError, "Communication hook must be callable.")
    sig = inspect.signature(hook)
    annotation = sig.parameters["bucket"].annotation
    if annotation not in (inspect.Parameter.empty, GradBucket, tdist.GradBucket):
        fail(ValueError, "Communication hook: bucket annotation should be dist.GradBucket.")
    if sig.return_annotation not in (
        inspect.Signature.empty,
        torch.futures.Future[torch.Tensor],
    ):
        fail(
            ValueError,
            "Communication hook: return annotation should be torch.futures.Future[torch.Tensor].",
        )
    if getattr(hook, "__name__", "") in ("bf16_compress_hook", "bf16_compress_wrapper_hook"):
        cuda = torch.version.cuda is not None or torch.version.hip is not None
        nccl = tdist.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10)
        if not (cuda and nccl):
            fail(
                TypeError,
                "BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+ "
                "or XPU and XCCL",
            )


def checked_future(result: Any) -> Any:
    """A comm hook's return value, refused with torch's error unless it is a Future."""
    if not isinstance(result, torch._C.Future):
        kind = type(result)
        raise RuntimeError(
            "DDP communication hook's callback must return a torch.futures.Future object, "
            f"but got {kind.__module__}.{kind.__qualname__}"
        )
    return result


def hook_result_tensor(value: Any) -> torch.Tensor:
    """The tensor a hook's future produced (a tensor, or a one-element list of tensors).

    Anything else raises torch's ``RuntimeError`` ("Unable to cast ... to Tensor").
    """
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], torch.Tensor):
        return value[0]
    raise RuntimeError(f"Unable to cast {value!r} to Tensor")
