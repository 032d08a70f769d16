"""The Reducer's own record of one bucket: flat buffer, per-parameter views, fill and write-back.

Parameters of a bucket share dtype and device (the bucket assignment guarantees it), so their
gradients can live back to back in one flat tensor that a single all-reduce moves.

Filling and writing back happen once per bucket, not once per gradient: small gradients are
moved together (a Python call per tensor costs more than copying a few kilobytes), large ones
one by one with a single pass each (multiply by ``1 / world_size`` while copying, as torch's
Reducer does); with a comm hook nothing is divided, so the whole bucket is one plain copy. On
the CPU, where ``torch._foreach_*`` loops over its tensors one dispatch at a time (~1-2 us
each), the small gradients are concatenated into one tensor, scaled there and written into
their slots with one ``index_copy_`` (a bucket of only small one-dimensional ones:
concatenated straight into the buffer); elsewhere ``_foreach_*`` is one fused kernel and
stays. The copies back into ``.grad`` can be gathered across buckets into one call (see
``write_back``). Either way every element goes through the same arithmetic as in torch's
Reducer, so results stay bitwise equal.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Collection, Iterable, Optional, Sequence, Union

import torch

from ferrodist.ddp.grad_bucket import GradBucket

#: Gradients with fewer elements are copied in one batched call per bucket; larger ones one by
#: one (a second pass over a large tensor costs more than the Python call it saves).
SMALL_NUMEL = 16384

_grad_of = operator.attrgetter("grad")

_VIEW_ERROR = (
    "Detected at least one parameter gradient is not the expected DDP bucket view with "
    "gradient_as_bucket_view=True. This may happen (for example) if multiple allreduce hooks "
    "were registered onto the same parameter. If you hit this error, please file an issue "
    "with a minimal repro."
)


def _flattened(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.reshape(-1) for t in tensors]


def _all_defined(grads: list[Optional[torch.Tensor]]) -> bool:
    return all(map(operator.is_not, grads, repeat(None)))


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
    future: Optional[Any] = None
    parameters: list[torch.Tensor] = field(default_factory=list)
    #: Positions of the gradients copied one by one (at least ``SMALL_NUMEL`` elements).
    large: frozenset[int] = frozenset()
    #: The other positions, in order.
    small: tuple[int, ...] = ()
    #: One parameter with a sparse gradient: ``buffer`` is that gradient itself, reduced as a
    #: sparse tensor (sparse gradients cannot share a flat buffer).
    sparse: bool = False
    #: Element positions of the ``small`` slots in the buffer, in order, for one
    #: ``index_copy_`` (on the CPU only; ``None`` elsewhere).
    small_index: Optional[torch.Tensor] = None
    #: Whether every ``small`` slot is one-dimensional (``torch.cat`` takes them as they are).
    flat_small: bool = False
    #: ``(divisor, 1 / divisor as a 0-dim tensor)`` of the last ``_reciprocal``.
    reciprocal_kept: Optional[tuple[int, torch.Tensor]] = None
    #: Positions already copied into their slot this iteration, as their gradient arrived
    #: (see ``take_early``); ``fill`` leaves them alone and forgets them.
    early: set[int] = field(default_factory=set)

    @classmethod
    def build(
        cls,
        params: Sequence[torch.Tensor],
        variable_indices: list[int],
        size_limit: int,
        sparse: bool = False,
        dtype: Optional[torch.dtype] = None,
    ) -> Bucket:
        """Allocate the flat buffer for ``params[i] for i in variable_indices``.

        ``dtype`` overrides the parameters' dtype (mixed precision: gradients arrive in the
        low-precision compute dtype).
        """
        members = [params[i] for i in variable_indices]
        if sparse:
            return cls._build_sparse(members, variable_indices, size_limit)
        dtypes = {p.dtype for p in members}
        devices = {p.device for p in members}
        if len(dtypes) != 1:
            raise RuntimeError("All parameters in a bucket must have the same dtype.")
        if len(devices) != 1:
            raise RuntimeError("All parameters in a bucket must be placed on the same device.")
        offsets, lengths, sizes = [], [], []
        total = 0
        for p in members:
            offsets.append(total)
            lengths.append(p.numel())
            sizes.append(p.shape)
            total += p.numel()
        buffer = torch.zeros(total, dtype=dtype or members[0].dtype, device=members[0].device)
        bucket = cls(variable_indices, size_limit, buffer, offsets, lengths, sizes, [])
        bucket.parameters = members
        bucket.views_in = bucket.views_of(buffer)
        bucket.large = frozenset(i for i, n in enumerate(lengths) if n >= SMALL_NUMEL)
        bucket.small = tuple(i for i in range(len(lengths)) if i not in bucket.large)
        bucket.flat_small = all(len(sizes[i]) == 1 for i in bucket.small)
        if buffer.device.type == "cpu" and len(bucket.small) > 1:
            bucket.small_index = torch.cat(
                [torch.arange(offsets[i], offsets[i] + lengths[i]) for i in bucket.small]
            )
        return bucket

    @classmethod
    def _build_sparse(
        cls, members: list[torch.Tensor], variable_indices: list[int], size_limit: int
    ) -> Bucket:
        if len(members) != 1:
            raise RuntimeError("A bucket for a sparse gradient must hold exactly one parameter.")
        (p,) = members
        empty = torch.sparse_coo_tensor(
            torch.empty((p.dim(), 0), dtype=torch.long, device=p.device),
            torch.empty((0,), dtype=p.dtype, device=p.device),
            p.shape,
            check_invariants=True,
        )
        bucket = cls(variable_indices, size_limit, empty, [0], [p.numel()], [p.shape], [])
        bucket.parameters = members
        bucket.sparse = True
        return bucket

    @property
    def nbytes(self) -> int:
        """Bytes of the bucket's parameters (what torch's Logger reports as its size)."""
        return sum(self.lengths) * self.parameters[0].element_size()

    def views_of(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Per-parameter views of a flat tensor laid out like this bucket."""
        return [
            flat.narrow(0, off, n).view(size)
            for off, n, size in zip(self.offsets, self.lengths, self.sizes)
        ]

    def grad_bucket(self, index: int, bucket_count: int, buffer: torch.Tensor) -> GradBucket:
        """The hook's view of this bucket, over ``buffer``."""
        views = self.views_in if buffer is self.buffer and not self.sparse else None
        return GradBucket(
            index,
            bucket_count,
            buffer,
            self.offsets,
            self.lengths,
            self.sizes,
            self.parameters,
            views,
        )

    # ---- into the bucket --------------------------------------------------------------------

    def take_early(
        self, pos: int, param: torch.Tensor, divide_by: Optional[int], as_bucket_view: bool
    ) -> None:
        """Copy one large gradient into its slot the moment it arrives, as torch's Reducer does.

        Called from the gradient's hook, while the gradient is still in cache and before the
        next layer's gradients are allocated; with ``as_bucket_view`` the fresh ``.grad`` is
        replaced by its slot at once, so its memory is free for the next gradient. Gradients
        this cannot take as they are (missing, aliasing the slot already, part of a graph) are
        left to ``fill``, which then does exactly what it did before.
        """
        grad = param.grad
        view = self.views_in[pos]
        if (
            grad is None
            or grad is view
            or grad.requires_grad
            or grad.layout != torch.strided
            or grad.data_ptr() == view.data_ptr()
        ):
            return
        if divide_by is None:
            view.copy_(grad)
        else:
            torch.mul(grad, self._reciprocal(divide_by), out=view)
        if as_bucket_view:
            param.grad = view
        self.early.add(pos)

    def _reciprocal(self, divide_by: int) -> Union[float, torch.Tensor]:
        """``1 / divide_by`` as the multiplier of a gradient copied into this bucket.

        On a float32 or float64 bucket on the CPU a 0-dim tensor of the bucket's dtype, kept
        while the divisor stays: ``torch.mul`` takes it without the dtype handling a Python
        number goes through (~2 us less per call) and multiplies by the very same value (a
        Python number is rounded to the bucket's dtype too), so results stay bitwise equal.
        """
        kept = self.reciprocal_kept
        if kept is not None and kept[0] == divide_by:
            return kept[1]
        scale = 1.0 / float(divide_by)
        dtype = self.buffer.dtype
        if self.buffer.device.type != "cpu" or dtype not in (torch.float32, torch.float64):
            return scale
        self.reciprocal_kept = (divide_by, torch.tensor(scale, dtype=dtype))
        return self.reciprocal_kept[1]

    def fill(self, divide_by: Optional[int], as_bucket_view: bool) -> None:
        """Put every parameter's gradient into its slot.

        A missing gradient becomes zeros; the others are divided by ``divide_by`` unless it is
        ``None`` (a comm hook averages by itself): multiplied by the reciprocal while copied,
        or divided in place where ``.grad`` already is the slot (gradient_as_bucket_view).
        With ``as_bucket_view``, ``param.grad`` becomes the slot itself.
        """
        if self.sparse:
            self._take_sparse_grad(divide_by)
            return
        grads: list[Optional[torch.Tensor]] = list(map(_grad_of, self.parameters))
        views = self.views_in
        early = self.early
        if early:
            self.early = set()
            # every large gradient taken early (the usual case): only the small ones are left
            rest = self.small if len(early) == len(self.large) else self._not_in(early)
            self._fill_rest(rest, grads, divide_by, as_bucket_view)
            return
        if as_bucket_view and all(map(operator.is_, grads, views)):
            if divide_by is not None:
                self.buffer.div_(divide_by)
            return
        if not as_bucket_view and _all_defined(grads):
            self._copy_scaled(range(len(views)), grads, divide_by)  # type: ignore[arg-type]
            return
        self._fill_rest(range(len(views)), grads, divide_by, as_bucket_view)

    def _not_in(self, done: Collection[int]) -> list[int]:
        return [pos for pos in range(len(self.views_in)) if pos not in done]

    def _fill_rest(
        self,
        positions: Iterable[int],
        grads: list[Optional[torch.Tensor]],
        divide_by: Optional[int],
        as_bucket_view: bool,
    ) -> None:
        """``fill``, one gradient at a time, for the gradients at ``positions``."""
        views = self.views_in
        copied, aliased, missing = [], [], []
        for pos in positions:
            grad, view = grads[pos], views[pos]
            if grad is None:
                missing.append(view)
            elif grad is view or (grad.data_ptr() == view.data_ptr() and grad.shape == view.shape):
                aliased.append(view)
            else:
                copied.append(pos)
        if missing:
            torch._foreach_zero_(missing)
        if aliased and divide_by is not None:
            torch._foreach_div_(aliased, divide_by)
        self._copy_scaled(copied, grads, divide_by)  # type: ignore[arg-type]
        if as_bucket_view:
            for pos in copied:
                self.parameters[pos].grad = views[pos]

    def _take_sparse_grad(self, divide_by: Optional[int]) -> None:
        # torch divides the sparse gradient in place and reduces that very tensor
        grad = self.parameters[0].grad
        if grad is None:
            raise RuntimeError("Expected sparse gradient to be defined.")
        if grad.layout != torch.sparse_coo:
            raise RuntimeError("Expected variable to have sparse gradient.")
        if divide_by is not None:
            grad.div_(divide_by)
        self.buffer = grad

    def _copy_scaled(
        self, positions: Sequence[int], grads: list[torch.Tensor], divide_by: Optional[int]
    ) -> None:
        """Copy ``grads`` at ``positions`` into their slots, times ``1 / divide_by``."""
        if not positions:
            return
        views = self.views_in
        scale = None if divide_by is None else 1.0 / float(divide_by)
        whole = len(positions) == len(views)
        if whole and not self.large:
            self._copy_whole(grads)
            if scale is not None:
                self.buffer.mul_(scale)
            return
        if scale is None and self.small_index is None:  # one fused copy for the bucket
            if whole:
                torch._foreach_copy_(views, grads)
            else:
                torch._foreach_copy_([views[p] for p in positions], [grads[p] for p in positions])
            return
        small: list[int] = []
        for pos in positions:
            if pos in self.large:
                if divide_by is None:
                    views[pos].copy_(grads[pos])
                else:  # the same multiplier as a large gradient taken as it arrives
                    torch.mul(grads[pos], self._reciprocal(divide_by), out=views[pos])
            else:
                small.append(pos)
        if small:
            self._copy_small(small, grads, scale)

    def _copy_whole(self, grads: list[torch.Tensor]) -> None:
        """Copy every gradient into its slot (the bucket holds small ones only)."""
        # one-dimensional gradients concatenate as they are; reshaping each first would cost
        # more than ``torch.cat`` saves over ``_foreach_copy_``
        if self.small_index is not None and self.flat_small:
            try:
                torch.cat(grads, out=self.buffer)
                return
            except RuntimeError:  # a gradient overlapping the buffer: copied one by one
                pass
        torch._foreach_copy_(self.views_in, grads)

    def _copy_small(
        self, small: list[int], grads: list[torch.Tensor], scale: Optional[float]
    ) -> None:
        """Copy the small gradients at ``small`` (ascending) into their slots, scaled."""
        taken = [grads[p] for p in small]
        if self.small_index is not None and len(small) == len(self.small):
            flat = torch.cat(taken if self.flat_small else _flattened(taken))
            if flat.dtype != self.buffer.dtype:
                flat = flat.to(self.buffer.dtype)
            if scale is not None:
                flat.mul_(scale)
            self.buffer.index_copy_(0, self.small_index, flat)
            return
        slots = [self.views_in[p] for p in small]
        torch._foreach_copy_(slots, taken)
        if scale is None:
            return
        if self.buffer.device.type != "cpu" or self.buffer.dtype in (torch.float32, torch.float64):
            torch._foreach_mul_(slots, scale)  # one fused kernel off the CPU, as it always was
        else:  # on the CPU ``_foreach_mul_`` rounds ``scale`` to a half type first: not torch's
            for slot in slots:
                slot.mul_(scale)

    # ---- out of the bucket ------------------------------------------------------------------

    def write_back(
        self,
        result: torch.Tensor,
        as_bucket_view: bool,
        unused: frozenset[int],
        copies: Optional[tuple[list[torch.Tensor], list[torch.Tensor]]] = None,
    ) -> None:
        """Copy the reduced values ``result`` (flat, bucket layout) into each ``.grad``.

        A parameter no rank used (its index in ``unused``) keeps its ``.grad`` untouched. With
        ``as_bucket_view`` the reduced values land in the bucket and ``.grad`` stays (or
        becomes) the bucket view. ``copies`` (targets, sources), when given, collects the
        ``.grad`` copies instead of doing them, for the caller to do several buckets' at once.
        """
        buffer = self.buffer
        if self.sparse:
            if result is not buffer:
                buffer.copy_(result)
            return
        views = self.views_in
        if result.dtype != buffer.dtype and not as_bucket_view:
            # a hook that reduced in another dtype (mixed precision's reduce_dtype): copy
            # straight from its result, as torch does, without rounding through the bucket
            views = self.views_of(result.reshape(-1))
        elif result is not buffer and (
            result.data_ptr() != buffer.data_ptr() or result.dtype != buffer.dtype
        ):
            buffer.copy_(result.reshape(-1))
        grads: list[Optional[torch.Tensor]] = list(map(_grad_of, self.parameters))
        if as_bucket_view:
            if all(map(operator.is_, grads, views)):
                return
            for pos, index in enumerate(self.variable_indices):
                grad = grads[pos]
                if index in unused or grad is views[pos]:
                    continue
                if grad is None:
                    self.parameters[pos].grad = views[pos]
                elif grad.data_ptr() != views[pos].data_ptr():
                    raise RuntimeError(_VIEW_ERROR)
            return
        if copies is not None:
            targets, sources = copies
        else:
            targets, sources = [], []
        if not unused and _all_defined(grads):
            targets += grads  # type: ignore[arg-type]
            sources += views
            if copies is None:
                torch._foreach_copy_(targets, sources)
            return
        for pos, index in enumerate(self.variable_indices):
            if index in unused:
                continue
            grad = grads[pos]
            if grad is None:
                param = self.parameters[pos]
                param.grad = torch.empty_like(param).copy_(views[pos])
            else:
                targets.append(grad)
                sources.append(views[pos])
        if copies is None and targets:
            torch._foreach_copy_(targets, sources)
