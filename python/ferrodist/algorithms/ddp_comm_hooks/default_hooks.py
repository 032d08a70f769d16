"""The default DDP communication hooks: plain average, and fp16/bf16 compressed averages.

Each hook divides before the sum (so low-precision values do not overflow) and returns a
future of a tensor shaped like the bucket buffer. They take any process group, or ``None``
for the default one, and work on ferrodist's and torch's DDP alike; their all-reduces are
recorded as DDP's (``ddp.all_reduce``), and a sparse gradient on gloo takes ferrodist's own sum
(``ferrodist._sparse_all_reduce``). The annotations are real objects (no ``from __future__
import annotations``): torch's DDP checks them at registration.
"""

from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ferrodist.ddp.comm_hook import ddp_all_reduce

__all__ = [
    "allreduce_hook",
    "bf16_compress_hook",
    "bf16_compress_wrapper",
    "fp16_compress_hook",
    "fp16_compress_wrapper",
]

Hook = Callable[[Any, Any], torch.futures.Future[torch.Tensor]]


def _group(process_group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    return process_group if process_group is not None else dist.group.WORLD  # type: ignore


def _allreduce_fut(
    process_group: Optional[dist.ProcessGroup], tensor: torch.Tensor
) -> torch.futures.Future[torch.Tensor]:
    """Divide ``tensor`` by the group size in place, then start its SUM all-reduce."""
    group = _group(process_group)
    tensor.div_(group.size())
    work = ddp_all_reduce(tensor, group=group, async_op=True)
    assert work is not None
    return work.get_future().then(lambda fut: fut.value()[0])


def allreduce_hook(
    process_group: Optional[dist.ProcessGroup], bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket across the group: the same result as DDP without a hook."""
    return _allreduce_fut(process_group, bucket.buffer())


def _compress_hook(
    dtype: torch.dtype, process_group: Optional[dist.ProcessGroup], bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    group = _group(process_group)
    buffer = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()
    compressed = buffer.to(dtype).div_(group.size())
    work = ddp_all_reduce(compressed, group=group, async_op=True)
    assert work is not None

    def decompress(fut: torch.futures.Future[Any]) -> torch.Tensor:
        buffer.copy_(fut.value()[0])  # in place, to save memory
        return buffer

    return work.get_future().then(decompress)


def fp16_compress_hook(
    process_group: Optional[dist.ProcessGroup], bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average a float16 copy of the bucket, written back into the bucket in its own dtype."""
    return _compress_hook(torch.float16, process_group, bucket)


def bf16_compress_hook(
    process_group: Optional[dist.ProcessGroup], bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average a bfloat16 copy of the bucket (DDP accepts it only with CUDA 11+ / NCCL 2.10+)."""
    return _compress_hook(torch.bfloat16, process_group, bucket)


def _compress_wrapper(dtype: torch.dtype, hook: Hook, name: str) -> Hook:
    def wrapper(hook_state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        bucket.set_buffer(bucket.buffer().to(dtype))
        fut = hook(hook_state, bucket)

        def write_back(fut: torch.futures.Future[Any]) -> torch.Tensor:
            value = fut.value()
            value = value[0] if isinstance(value, list) else value
            buffer = bucket.buffer()
            buffer.copy_(value)
            return buffer

        return fut.then(write_back)

    wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


def fp16_compress_wrapper(hook: Hook) -> Hook:
    """Run ``hook`` on a float16 copy of the bucket; DDP casts the result back into ``.grad``."""
    return _compress_wrapper(torch.float16, hook, "fp16_compress_wrapper_hook")


def bf16_compress_wrapper(hook: Hook) -> Hook:
    """Run ``hook`` on a bfloat16 copy of the bucket; DDP casts the result back into ``.grad``."""
    return _compress_wrapper(torch.bfloat16, hook, "bf16_compress_wrapper_hook")
