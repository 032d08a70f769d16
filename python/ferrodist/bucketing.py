"""DDP gradient bucket assignment, as ``torch.distributed._compute_bucket_assignment_by_size``.

Two entry points compute the same thing in Rust (``rust/bucket.rs``) from metadata only:

* :func:`compute_bucket_assignment_by_size` takes tensors, with torch's signature and result;
  it reads ``nbytes``, ``dtype`` and ``device`` of each tensor in one native pass.
* :func:`compute_bucket_assignment_by_size_from_metadata` takes what DDP and ZeRO already hold:
  byte sizes, dtype ids and device ids as lists or arrays (numpy, torch, ``array.array``).
  It never touches a tensor, which makes it an order of magnitude faster at 100k tensors.

Use :func:`dtype_id` and :func:`device_id` for the ids: they are torch's own codes, which also
reproduce torch's order of the leftover buckets when ``tensor_indices`` is given. Any other
integers group tensors correctly.

Unlike torch, bad input raises an error naming the argument instead of crashing the process:
an empty limit list, ``tensor_indices`` that are not a permutation of ``range(len(tensors))``,
a negative limit, an object that is not a tensor.
"""

from __future__ import annotations

import array
import operator
from collections.abc import Sequence
from typing import Any, Union

import torch

from ferrodist import _native

__all__ = [
    "compute_bucket_assignment_by_size",
    "compute_bucket_assignment_by_size_from_metadata",
    "device_id",
    "dtype_id",
]

# torch's ScalarType codes, in enum order (c10 ScalarType); names this torch lacks are skipped.
_SCALAR_TYPE_ORDER = (
    "uint8 int8 int16 int32 int64 float16 float32 float64 complex32 complex64 complex128 bool "
    "qint8 quint8 qint32 bfloat16 quint4x2 quint2x4 bits1x8 bits2x4 bits4x2 bits8 bits16 "
    "float8_e5m2 float8_e4m3fn float8_e5m2fnuz float8_e4m3fnuz uint16 uint32 uint64 "
    "uint1 uint2 uint3 uint4 uint5 uint6 uint7 int1 int2 int3 int4 int5 int6 int7 "
    "float8_e8m0fnu float4_e2m1fn_x2"
).split()

_DTYPE_IDS: dict[torch.dtype, int] = {
    getattr(torch, name): code
    for code, name in enumerate(_SCALAR_TYPE_ORDER)
    if isinstance(getattr(torch, name, None), torch.dtype)
}

IntArray = Union[Sequence[int], "array.array[int]", Any]
"""A 1-D run of integers: list, tuple, ``array.array``, numpy array or CPU torch tensor."""


def dtype_id(dtype: torch.dtype) -> int:
    """torch's ScalarType code of ``dtype`` (``torch.float32`` is 6)."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: expected a torch.dtype, got {type(dtype).__name__}")
    return _DTYPE_IDS.get(dtype, hash(dtype))


def device_id(device: torch.device | str | int) -> int:
    """torch's device code: ``type << 16 | index`` (index -1, as on CPU, counts as 255)."""
    return hash(torch.device(device))


def compute_bucket_assignment_by_size(
    tensors: Sequence[torch.Tensor],
    bucket_size: Sequence[int] | None = None,
    expect_sparse_gradient: Sequence[bool] = (),
    tensor_indices: Sequence[int] = (),
    logger: object | None = None,
    *,
    bucket_size_limits: Sequence[int] | None = None,
) -> tuple[list[list[int]], list[int]]:
    """Group tensors into DDP buckets, as ``torch.distributed._compute_bucket_assignment_by_size``.

    Returns ``(bucket_indices, per_bucket_size_limits)``. Tensors are grouped by
    ``(dtype, device)``; each group fills buckets up to ``bucket_size[0]``, then
    ``bucket_size[1]``, ..., repeating the last limit; a bucket closes once it reaches its limit.
    Tensors flagged in ``expect_sparse_gradient`` get a bucket of their own (limit 0). Without
    ``tensor_indices`` the buckets are sorted by their smallest index; with it (a permutation,
    the gradient-ready order) they are not.

    ``bucket_size_limits`` is a keyword alias of ``bucket_size``; ``logger`` is accepted for
    torch compatibility and unused. Only metadata is read, never tensor data.

    Example::

        >>> ts = [torch.empty(30) for _ in range(4)]  # 120 bytes each
        >>> compute_bucket_assignment_by_size(ts, [100, 1000])
        ([[0], [1, 2, 3]], [100, 1000])
    """
    limits = _limits(bucket_size, bucket_size_limits)
    return _native.bucket_assignment_of_tensors(
        tensors, limits, list(expect_sparse_gradient), list(tensor_indices), _DTYPE_IDS
    )


def compute_bucket_assignment_by_size_from_metadata(
    sizes: IntArray,
    dtype_ids: IntArray,
    device_ids: IntArray,
    bucket_size_limits: Sequence[int],
    expect_sparse_gradient: Sequence[bool] = (),
    tensor_indices: IntArray = (),
) -> tuple[list[list[int]], list[int]]:
    """The same assignment from metadata: byte size, dtype id and device id of each tensor.

    ``sizes[i]`` is ``numel * element_size`` of tensor ``i``; tensors with equal
    ``(dtype_ids[i], device_ids[i])`` may share a bucket. Use :func:`dtype_id` and
    :func:`device_id` for torch-identical ordering. Arrays may be lists, tuples,
    ``array.array``, numpy arrays or CPU torch tensors of integers.

    Example::

        >>> compute_bucket_assignment_by_size_from_metadata(
        ...     [120] * 4, [6] * 4, [255] * 4, [100, 1000])
        ([[0], [1, 2, 3]], [100, 1000])
    """
    return _native.bucket_assignment_from_metadata(
        _packed("sizes", sizes),
        _packed("dtype_ids", dtype_ids),
        _packed("device_ids", device_ids),
        _limits(bucket_size_limits, None),
        list(expect_sparse_gradient),
        _packed("tensor_indices", tensor_indices),
    )


def _limits(positional: Sequence[int] | None, keyword: Sequence[int] | None) -> list[int]:
    if positional is not None and keyword is not None:
        raise TypeError("pass bucket_size or bucket_size_limits, not both")
    limits = positional if positional is not None else keyword
    if limits is None:
        raise TypeError("missing required argument: bucket_size_limits")
    if isinstance(limits, (str, bytes)) or not isinstance(limits, Sequence):
        raise TypeError(
            f"bucket_size_limits: expected a sequence of ints, got {type(limits).__name__}"
        )
    try:
        return [operator.index(limit) for limit in limits]
    except TypeError:
        bad = next(i for i, limit in enumerate(limits) if not hasattr(limit, "__index__"))
        raise TypeError(
            f"bucket_size_limits[{bad}]: expected an int, got {type(limits[bad]).__name__}"
        ) from None


def _packed(name: str, values: IntArray) -> bytes | list[int]:
    """Lists and tuples go as they are; arrays are packed as native int64 bytes (no copy
    per element in Python)."""
    if isinstance(values, (list, tuple)):
        return list(values)
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    if isinstance(values, array.array):
        if values.typecode not in "bBhHiIlLqQ":
            raise TypeError(f"{name}: expected integers, got array of {values.typecode!r}")
        return array.array("q", values).tobytes()
    if hasattr(values, "__array__") and hasattr(values, "dtype"):
        import numpy as np

        arr = np.asarray(values)
        if arr.ndim != 1 or arr.dtype.kind not in "iub":
            raise TypeError(f"{name}: expected a 1-D integer array, got {arr.dtype} {arr.shape}")
        return np.ascontiguousarray(arr, dtype=np.int64).tobytes()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name}: expected a sequence of ints, got {type(values).__name__}")
    return list(values)
