"""Where DDP gets its bucket assignment from.

DDP groups parameters into buckets with the rule of torch's
``torch.distributed._compute_bucket_assignment_by_size``. ferrodist computes that rule in Rust
(``ferrodist.bucketing.compute_bucket_assignment_by_size``, same signature and result, but bad
input raises instead of crashing). Every call in this package goes through
:func:`assign_buckets`, the one place that names the implementation.
"""

from __future__ import annotations

import sys
from typing import Sequence

import torch

from ferrodist.bucketing import compute_bucket_assignment_by_size

#: torch's ``_DEFAULT_FIRST_BUCKET_BYTES``: the small first bucket used when the user leaves
#: ``bucket_cap_mb`` at its default, so the first all-reduce starts early in backward.
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024
#: ``bucket_cap_mb=None`` means 25 MiB, as in torch.
DEFAULT_BUCKET_CAP_MB = 25
MB_TO_BYTES = 1024 * 1024
#: Limit that puts every parameter of one (dtype, device) into a single bucket.
NO_LIMIT = sys.maxsize


def assign_buckets(
    tensors: Sequence[torch.Tensor],
    bucket_size_limits: Sequence[int],
    expect_sparse_gradient: Sequence[bool] = (),
    tensor_indices: Sequence[int] = (),
) -> tuple[list[list[int]], list[int]]:
    """Bucket ``tensors`` by byte size: ``(bucket_indices, per_bucket_size_limits)``."""
    indices, limits = compute_bucket_assignment_by_size(
        list(tensors), list(bucket_size_limits), list(expect_sparse_gradient), list(tensor_indices)
    )
    return [list(map(int, b)) for b in indices], [int(x) for x in limits]
