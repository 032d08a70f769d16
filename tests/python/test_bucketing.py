"""Bucket assignment: ferrodist against torch's ``_compute_bucket_assignment_by_size``.

Property tests draw tensors of many dtypes on two devices (cpu, meta), limit lists, sparse
flags and gradient-ready permutations, and require exactly torch's result from both ferrodist
entry points. With ``tensor_indices`` given torch does not sort, so these also check the replay
of torch's hash-map order for leftover buckets (up to 40 dtype/device groups, past two
rehashes).
"""

from __future__ import annotations

import array
import sys

import numpy as np
import pytest
import torch
import torch.distributed as tdist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ferrodist
from ferrodist.bucketing import (
    compute_bucket_assignment_by_size,
    compute_bucket_assignment_by_size_from_metadata,
    device_id,
    dtype_id,
)

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.complex32,
    torch.float8_e5m2fnuz,
    torch.float8_e4m3fnuz,
]
DEVICES = ["cpu", "meta"]

Case = tuple[list[torch.Tensor], list[int], list[bool], list[int]]


@st.composite
def cases(draw: st.DrawFn, max_groups: int = len(DTYPES) * len(DEVICES)) -> Case:
    groups = draw(
        st.lists(
            st.tuples(st.sampled_from(DTYPES), st.sampled_from(DEVICES)),
            min_size=1,
            max_size=max_groups,
            unique=True,
        )
    )
    n = draw(st.integers(1, 40))
    numels = draw(st.lists(st.integers(0, 64), min_size=n, max_size=n))
    picks = draw(st.lists(st.integers(0, len(groups) - 1), min_size=n, max_size=n))
    tensors = [
        torch.empty(numel, dtype=groups[g][0], device=groups[g][1])
        for numel, g in zip(numels, picks)
    ]
    limits = draw(
        st.lists(st.one_of(st.integers(0, 600), st.just(sys.maxsize)), min_size=1, max_size=4)
    )
    sparse = draw(st.one_of(st.just([]), st.lists(st.booleans(), min_size=n, max_size=n)))
    indices = draw(st.one_of(st.just([]), st.permutations(range(n))))
    return tensors, limits, sparse, list(indices)


def metadata(tensors: list[torch.Tensor]) -> tuple[list[int], list[int], list[int]]:
    return (
        [t.nbytes for t in tensors],
        [dtype_id(t.dtype) for t in tensors],
        [device_id(t.device) for t in tensors],
    )


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_matches_torch_on_random_inputs(case: Case) -> None:
    tensors, limits, sparse, indices = case
    expected = tdist._compute_bucket_assignment_by_size(tensors, limits, sparse, indices)
    assert compute_bucket_assignment_by_size(tensors, limits, sparse, indices) == expected
    sizes, dtypes, devices = metadata(tensors)
    got = compute_bucket_assignment_by_size_from_metadata(
        sizes, dtypes, devices, limits, sparse, indices
    )
    assert got == expected


@settings(max_examples=100, deadline=None)
@given(st.permutations(range(len(DTYPES) * len(DEVICES))), st.integers(0, 10_000))
def test_leftover_order_matches_torch_past_rehash(order: list[int], seed: int) -> None:
    """40 groups, every tensor in a leftover bucket: the order is torch's map order."""
    pairs = [(d, dev) for d in DTYPES for dev in DEVICES]
    rng = np.random.default_rng(seed)
    tensors = [
        torch.empty(int(rng.integers(1, 4)), dtype=pairs[g][0], device=pairs[g][1])
        for g in order
        for _ in range(int(rng.integers(1, 3)))
    ]
    indices = [int(i) for i in rng.permutation(len(tensors))]
    expected = tdist._compute_bucket_assignment_by_size(tensors, [1 << 20], [], indices)
    assert compute_bucket_assignment_by_size(tensors, [1 << 20], [], indices) == expected


def test_documented_examples() -> None:
    f32 = [torch.empty(30) for _ in range(4)]
    assert ferrodist.compute_bucket_assignment_by_size(f32, [100, 1000]) == (
        [[0], [1, 2, 3]],
        [100, 1000],
    )
    ten = [torch.empty(10) for _ in range(4)]
    assert compute_bucket_assignment_by_size(ten, [0]) == ([[0], [1], [2], [3]], [0, 0, 0, 0])
    assert compute_bucket_assignment_by_size(ten, bucket_size_limits=[40, 80]) == (
        [[0], [1, 2], [3]],
        [40, 80, 80],
    )


def test_metadata_accepts_arrays() -> None:
    tensors = [torch.empty(n % 7 + 1, dtype=DTYPES[n % 3]) for n in range(50)]
    sizes, dtypes, devices = metadata(tensors)
    expected = tdist._compute_bucket_assignment_by_size(tensors, [40, 100])
    for convert in (
        np.array,
        lambda v: np.array(v, dtype=np.int32),
        torch.tensor,
        lambda v: array.array("q", v),
        tuple,
    ):
        got = compute_bucket_assignment_by_size_from_metadata(
            convert(sizes), convert(dtypes), convert(devices), [40, 100]
        )
        assert got == expected


def test_tensor_data_is_never_read() -> None:
    """Meta tensors have no data; a 1 TiB one is sized from metadata alone."""
    huge = torch.empty(1 << 38, dtype=torch.float32, device="meta")
    small = torch.empty(3, device="meta")
    assert compute_bucket_assignment_by_size([small, huge, small], [100]) == (
        [[0, 1], [2]],
        [100, 100],
    )


@pytest.mark.parametrize(
    ("args", "error", "names"),
    [
        (([], [100]), RuntimeError, "tensors"),
        (([torch.empty(1)], []), ValueError, "bucket_size_limits"),
        (([torch.empty(1)], [-5]), TypeError, "bucket_size_limits[0]"),
        (([torch.empty(1)], ["big"]), TypeError, "bucket_size_limits[0]"),
        (([torch.empty(1)], 100), TypeError, "bucket_size_limits"),
        (([torch.empty(1), 3], [100]), TypeError, "tensors[1]"),
        ((torch.empty(3), [100]), TypeError, "tensors"),
        (([torch.empty(1)] * 2, [100], [True]), RuntimeError, "expect_sparse_gradient"),
        (([torch.empty(1)] * 3, [100], [], [0, 1]), ValueError, "tensor_indices"),
        (([torch.empty(1)] * 3, [100], [], [0, 1, 3]), ValueError, "tensor_indices[2] = 3"),
        (([torch.empty(1)] * 3, [100], [], [0, -1, 2]), ValueError, "tensor_indices[1] = -1"),
        (([torch.empty(1)] * 3, [100], [], [0, 1, 1]), ValueError, "repeats tensor_indices[1]"),
    ],
)
def test_bad_input_names_the_argument(args: tuple, error: type, names: str) -> None:
    with pytest.raises(error) as raised:
        compute_bucket_assignment_by_size(*args)
    assert names in str(raised.value)


def test_sparse_tensor_is_refused_like_torch() -> None:
    sparse = torch.sparse_coo_tensor([[0]], [1.0], (3,))
    with pytest.raises(RuntimeError, match="No support for sparse tensors"):
        tdist._compute_bucket_assignment_by_size([torch.empty(1), sparse], [100])
    with pytest.raises(RuntimeError, match=r"No support for sparse tensors. \(tensors\[1\]"):
        compute_bucket_assignment_by_size([torch.empty(1), sparse], [100])


def test_csr_tensor_is_sized_like_torch() -> None:
    csr = torch.eye(4).to_sparse_csr()
    tensors = [torch.empty(3), csr, torch.empty(5)]
    expected = tdist._compute_bucket_assignment_by_size(tensors, [40])
    assert compute_bucket_assignment_by_size(tensors, [40]) == expected


def test_metadata_rejects_mismatched_lengths_and_negative_sizes() -> None:
    with pytest.raises(ValueError, match="dtype_ids"):
        compute_bucket_assignment_by_size_from_metadata([4, 4], [6], [255, 255], [8])
    with pytest.raises(TypeError, match=r"sizes\[1\] = -4"):
        compute_bucket_assignment_by_size_from_metadata([4, -4], [6, 6], [255, 255], [8])
    with pytest.raises(TypeError, match="sizes"):
        compute_bucket_assignment_by_size_from_metadata(np.array([1.5]), [6], [255], [8])
