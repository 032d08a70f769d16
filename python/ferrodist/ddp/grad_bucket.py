"""``GradBucket``: what a communication hook sees of one bucket.

A bucket is a flat 1-D buffer holding the gradients of several parameters back to back. The
hook reduces ``buffer()`` (or a compressed copy set with ``set_buffer``) and returns a future
whose value has the buffer's number of elements; the Reducer then writes that value back into
the parameters' ``.grad``. Method names and meanings are torch's ``dist.GradBucket``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch


class GradBucket:
    """One bucket of gradients handed to a DDP communication hook."""

    def __init__(
        self,
        index: int,
        bucket_count: int,
        buffer: torch.Tensor,
        offsets: Sequence[int],
        lengths: Sequence[int],
        sizes: Sequence[torch.Size],
        parameters: Sequence[torch.Tensor],
        views: Optional[Sequence[torch.Tensor]] = None,
    ) -> None:
        self._index = index
        self._bucket_count = bucket_count
        self._buffer = buffer
        # Kept as given, not copied (the Reducer builds one per bucket and iteration, and
        # copying lists of thousands of tensors touches every one): accessors hand out copies.
        self._offsets = offsets
        self._lengths = lengths
        self._sizes = sizes
        self._parameters = parameters
        # Views of ``buffer`` made once by the Reducer; valid until ``set_buffer``.
        self._views = views

    def index(self) -> int:
        """Position in reduction order; bucket 0 is reduced first (the last layers)."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat buffer of all gradients of the bucket, in ``parameters()`` order."""
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        """One view into ``buffer()`` per parameter, shaped like the parameter.

        A sparse gradient's bucket has none (a sparse tensor has no flat views): empty, as in
        torch, whose hooks zip this with ``parameters()`` and so leave sparse buckets alone.
        """
        if self._buffer.layout == torch.sparse_coo:
            return []
        if self._views is not None:
            return list(self._views)
        return [
            self._buffer.narrow(0, off, n).view(size)
            for off, n, size in zip(self._offsets, self._lengths, self._sizes)
        ]

    def parameters(self) -> list[torch.Tensor]:
        """The model parameters of this bucket, in the same order as ``gradients()``."""
        return list(self._parameters)

    def is_last(self) -> bool:
        """Whether this is the last bucket to be reduced in an iteration."""
        return self._index == self._bucket_count - 1

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """Replace the buffer (compression wrappers hand a low-precision copy on)."""
        self._buffer = buffer
        self._views = None

    def __repr__(self) -> str:
        return f"GradBucket(index={self._index}, numel={self._buffer.numel()})"
