"""The Reducer's own record of one bucket: flat buffer, per-parameter views, readiness count.

Parameters of a bucket share dtype and device (the bucket assignment guarantees it), so their
gradients can live back to back in one flat tensor that a single all-reduce moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from ferrodist.ddp.grad_bucket import GradBucket


@dataclass
class Bucket:
    """One bucket: which parameters, where their gradients sit, and this iteration's state."""

    variable_indices: list[int]
    size_limit: int
    buffer: torch.Tensor
    offsets: list[int]
    lengths: list[int]
    sizes: list[torch.Size]
    #: Views of ``buffer`` the gradients are copied into (and, with gradient_as_bucket_view,
    #: the tensors that ``param.grad`` points at).
    views_in: list[torch.Tensor]
    #: Views of the hook's result, written back into ``.grad`` at the end of backward.
    views_out: list[torch.Tensor]
    pending: int = 0
    future: Optional[Any] = None
    parameters: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def build(
        cls, params: Sequence[torch.Tensor], variable_indices: list[int], size_limit: int
    ) -> Bucket:
        """Allocate the flat buffer for ``params[i] for i in variable_indices``."""
        members = [params[i] for i in variable_indices]
        dtypes = {p.dtype for p in members}
        devices = {p.device for p in members}
        if len(dtypes) != 1 or len(devices) != 1:
            raise ValueError("All parameters of a bucket must share one dtype and one device.")
        offsets, lengths, sizes = [], [], []
        total = 0
        for p in members:
            offsets.append(total)
            lengths.append(p.numel())
            sizes.append(p.shape)
            total += p.numel()
        buffer = torch.zeros(total, dtype=members[0].dtype, device=members[0].device)
        bucket = cls(variable_indices, size_limit, buffer, offsets, lengths, sizes, [], [])
        bucket.parameters = members
        bucket.views_in = bucket.views_of(buffer)
        bucket.views_out = bucket.views_in
        return bucket

    def views_of(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Per-parameter views of a flat tensor laid out like this bucket."""
        return [
            flat.narrow(0, off, n).view(size)
            for off, n, size in zip(self.offsets, self.lengths, self.sizes)
        ]

    def grad_bucket(self, index: int, bucket_count: int, buffer: torch.Tensor) -> GradBucket:
        """The hook's view of this bucket, over ``buffer``."""
        return GradBucket(
            index, bucket_count, buffer, self.offsets, self.lengths, self.sizes, self.parameters
        )

    def copy_in(
        self, pos: int, param: torch.Tensor, divide_by: Optional[int], as_bucket_view: bool
    ) -> None:
        """Put ``param``'s gradient into its slot: zeros if it has none; divided by
        ``divide_by`` unless that is ``None`` (a comm hook averages by itself). With
        ``as_bucket_view``, ``param.grad`` becomes the slot itself."""
        view = self.views_in[pos]
        grad = param.grad
        if grad is None:
            view.zero_()
            return
        if grad.data_ptr() == view.data_ptr() and grad.shape == view.shape:
            if divide_by is not None:
                view.div_(divide_by)
            return
        if divide_by is not None:
            # one pass: multiply by the reciprocal while copying, as torch's Reducer does
            torch.mul(grad.detach(), 1.0 / float(divide_by), out=view)
        else:
            view.copy_(grad)
        if as_bucket_view:
            param.grad = view

    def write_back(self, as_bucket_view: bool, globally_unused: Callable[[int], bool]) -> None:
        """Copy the reduced values (``views_out``) into each parameter's ``.grad``.

        A parameter no rank used keeps its ``.grad`` untouched. With ``as_bucket_view`` the
        reduced values land in the bucket and ``.grad`` stays (or becomes) the bucket view.
        """
        for pos, index in enumerate(self.variable_indices):
            param = self.parameters[pos]
            out = self.views_out[pos]
            unused = globally_unused(index)
            if not as_bucket_view:
                if unused:
                    continue
                if param.grad is None:
                    param.grad = torch.empty_like(param).copy_(out)
                else:
                    param.grad.copy_(out)
                continue
            view_in = self.views_in[pos]
            if view_in.data_ptr() != out.data_ptr() or view_in.dtype != out.dtype:
                view_in.copy_(out)
            if unused:
                continue
            if param.grad is None:
                param.grad = view_in
            elif param.grad.data_ptr() != view_in.data_ptr():
                raise RuntimeError(
                    "Detected at least one parameter gradient is not the expected DDP bucket "
                    "view with gradient_as_bucket_view=True. This may happen (for example) if "
                    "multiple allreduce hooks were registered onto the same parameter. If you "
                    "hit this error, please file an issue with a minimal repro."
                )
