"""One DDP bucket's fill against torch's arithmetic, without a process group.

torch's Reducer puts each gradient into its slot as ``grad * (1 / world_size)`` (a plain copy
under a comm hook) and zeros for a missing one. ``Bucket`` does the same for many gradients at
once (small ones concatenated, scaled and scattered with one ``index_copy_`` on the CPU, large
ones one by one, some of them as they arrive): every path must give exactly torch's bits.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrodist.ddp.bucket import SMALL_NUMEL, Bucket

#: Shapes a bucket meets: a scalar parameter, biases, small matrices, one large matrix.
SHAPES = [(), (3,), (17,), (4, 5), (2, 3, 4), (SMALL_NUMEL // 64, 64), (7, 7)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _expected(grad: torch.Tensor, divide_by: Optional[int]) -> torch.Tensor:
    """torch's Reducer: ``mul_out(slot, grad, 1 / divide_by)``, or a copy under a comm hook."""
    if divide_by is None:
        return grad.clone()
    return torch.mul(grad, 1.0 / float(divide_by))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


@settings(max_examples=60, deadline=None)
@given(
    picks=st.lists(st.integers(0, len(SHAPES) - 1), min_size=1, max_size=9),
    dtype=st.sampled_from(DTYPES),
    divide_by=st.sampled_from([None, 1, 3, 7]),
    as_bucket_view=st.booleans(),
    missing=st.sets(st.integers(0, 8)),
    taken_early=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_filled_slots_hold_torchs_bits(
    picks: list[int],
    dtype: torch.dtype,
    divide_by: Optional[int],
    as_bucket_view: bool,
    missing: set[int],
    taken_early: bool,
    seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    params = [
        torch.nn.Parameter(torch.zeros(SHAPES[i], dtype=dtype), requires_grad=True) for i in picks
    ]
    bucket = Bucket.build(params, list(range(len(params))), 1 << 30)
    grads: list[Optional[torch.Tensor]] = []
    for pos, p in enumerate(params):
        grad = None if pos in missing else (torch.randn(p.shape, generator=gen) * 100).to(dtype)
        p.grad = grad
        grads.append(grad)
    if taken_early:  # large gradients arrive first, as the per-gradient hook hands them over
        for pos in bucket.large:
            bucket.take_early(pos, params[pos], divide_by, as_bucket_view)

    bucket.fill(divide_by, as_bucket_view)

    for pos, (view, grad) in enumerate(zip(bucket.views_in, grads)):
        if grad is None:
            assert torch.equal(_bits(view), _bits(torch.zeros_like(view))), pos
            continue
        expected = _expected(grad, divide_by)
        assert torch.equal(_bits(view), _bits(expected)), (pos, SHAPES[picks[pos]])
        if as_bucket_view:
            assert params[pos].grad is view
        else:
            assert params[pos].grad is grad
    assert not bucket.early, "fill forgets what was taken early"


def test_a_scalar_and_matrices_share_one_concatenated_copy() -> None:
    """Only small gradients of mixed rank: one ``torch.cat`` straight into the buffer."""
    params = [torch.nn.Parameter(torch.zeros(s)) for s in [(), (4, 5), (3,), (2, 3, 4)]]
    bucket = Bucket.build(params, [0, 1, 2, 3], 1 << 30)
    assert bucket.small_index is not None and not bucket.large
    for i, p in enumerate(params):
        p.grad = torch.full(p.shape, float(i + 1))
    bucket.fill(3, False)
    expected = torch.cat([torch.mul(p.grad, 1.0 / 3.0).reshape(-1) for p in params])  # type: ignore[union-attr]
    assert torch.equal(bucket.buffer, expected)


def test_a_gradient_overlapping_the_buffer_still_fills() -> None:
    """A ``.grad`` set by hand to a view of the bucket's own slot cannot go through
    ``torch.cat(out=buffer)``: the bucket copies one by one instead, and nothing is lost."""
    params = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4))]
    bucket = Bucket.build(params, [0, 1], 1 << 30)
    bucket.buffer.copy_(torch.arange(8.0))
    params[0].grad = bucket.buffer.narrow(0, 0, 4)  # its own slot, another tensor object
    params[1].grad = torch.full((4,), 9.0)
    bucket.fill(None, False)
    assert torch.equal(bucket.buffer, torch.tensor([0.0, 1, 2, 3, 9, 9, 9, 9]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("divide_by", [1, 2, 3, 5, 7, 24])
def test_a_large_gradient_taken_early_is_torchs_product(dtype: torch.dtype, divide_by: int) -> None:
    param = torch.nn.Parameter(torch.zeros(SMALL_NUMEL, dtype=dtype))
    bucket = Bucket.build([param], [0], 1 << 30)
    grad = (torch.randn(SMALL_NUMEL, generator=torch.Generator().manual_seed(divide_by)) * 1e3).to(
        dtype
    )
    param.grad = grad
    bucket.take_early(0, param, divide_by, False)
    assert bucket.early == {0}
    assert torch.equal(_bits(bucket.views_in[0]), _bits(torch.mul(grad, 1.0 / float(divide_by))))
