"""Collectives and point-to-point ops, as ``torch.distributed`` spells them.

Tensor traffic goes through torch's own backends (gloo on CPU, NCCL on CUDA), so where ferrodist
adds nothing the name *is* torch's function: no wrapper, no per-call Python overhead, the same
``Work`` handles and the same errors. The four reductions that take a ``ReduceOp`` are the only
wrappers, because gloo rejects ``PREMUL_SUM`` ("Cannot use ReduceOp.PREMUL_SUM with Gloo"):
for a premultiplied sum on any backend but NCCL, ferrodist scales the input by the op's factor and
runs a plain ``SUM`` through the backend, which is what ``PREMUL_SUM`` means. Every other op goes
straight to torch after one type check. (gloo in torch 2.13 runs ``AVG`` itself.) A sparse
tensor's all-reduce on gloo is ferrodist's own, made of dense all-gathers, with the same result
to the bit (``_sparse_all_reduce``): gloo's corrupts the process's heap now and then.

Every collective and point-to-point op is recorded in the flight recorder (``ferrodist.debug``)
on its way to torch, so these are thin wrappers with torch's signatures
(``ferrodist._recorded_ops``). ``P2POp`` and ``batch_isend_irecv`` stay torch's own: a
``P2POp`` built with ``ferrodist.isend`` is recorded when torch's ``batch_isend_irecv`` calls it.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as _tdist
from torch.distributed import P2POp, batch_isend_irecv

from ferrodist import _sparse_all_reduce as _sparse
from ferrodist._recorded_ops import collective, p2p
from ferrodist.c10d import ProcessGroup, ReduceOp, Work

__all__ = [
    "P2POp",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "irecv",
    "isend",
    "monitored_barrier",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
]

_SUM = ReduceOp.SUM
_PREMUL_SUM = ReduceOp.RedOpType.PREMUL_SUM  # type: ignore[attr-defined]
_torch_all_reduce = _tdist.all_reduce
_torch_reduce = _tdist.reduce
_torch_reduce_scatter = _tdist.reduce_scatter
_torch_reduce_scatter_tensor = _tdist.reduce_scatter_tensor


def _premul_factor(op: Any, tensor: torch.Tensor, group: Optional[ProcessGroup]) -> Any:
    """The factor to apply by hand, or None when the backend can run ``op`` itself.

    Only a ``ReduceOp`` instance (what ``_make_nccl_premul_sum`` returns) can carry a factor; the
    plain members (``ReduceOp.SUM``...) are ``RedOpType`` values, which the callers filter out
    with one identity check before calling this, so a plain op costs no extra call.
    """
    # torch exposes .op on ReduceOp instances (its stubs do not).
    if op.__class__ is not ReduceOp or op.op != _PREMUL_SUM:  # type: ignore[attr-defined]
        return None
    if tensor.is_cuda and "nccl" in str(_tdist.get_backend(group)):
        return None
    return _factor_of(op)


def _factor_of(op: Any) -> Any:
    """A ``PREMUL_SUM`` op's factor: ``op.factor`` where torch exposes it (2.13), else from the
    op's pickled state, ``(RedOpType.PREMUL_SUM, factor)`` (torch 2.11 has no ``factor``)."""
    factor = getattr(op, "factor", None)
    return factor if factor is not None else op.__getstate__()[1]


def _premultiplied(
    op: Any, output: torch.Tensor, input: torch.Tensor, group: Optional[ProcessGroup]
) -> tuple[torch.Tensor, Any]:
    """For a one-tensor reduce-scatter: a scaled copy of ``input`` and SUM where ``op`` is a
    PREMUL_SUM the backend cannot run, else ``input`` and ``op`` unchanged."""
    factor = _premul_factor(op, output, group) if op.__class__ is ReduceOp else None
    if factor is None:
        return input, op
    return input * factor, _SUM


def _all_reduce(
    tensor: torch.Tensor,
    op: Any = _SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
) -> Optional[Work]:
    """``torch.distributed.all_reduce``; ``PREMUL_SUM`` also works on gloo, and a sparse
    tensor's sum on gloo is ferrodist's (``_sparse_all_reduce``: gloo's corrupts the heap)."""
    factor = _premul_factor(op, tensor, group) if op.__class__ is ReduceOp else None
    if factor is not None:
        tensor.mul_(factor)
        op = _SUM
    if getattr(tensor, "is_sparse", False) and _sparse.handles(tensor, op, group, async_op):
        return _sparse.sparse_all_reduce(tensor, group, async_op)
    return _torch_all_reduce(tensor, op, group, async_op)


def _reduce(
    tensor: torch.Tensor,
    dst: Optional[int] = None,
    op: Any = _SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    group_dst: Optional[int] = None,
) -> Optional[Work]:
    """``torch.distributed.reduce``; ``PREMUL_SUM`` also works on gloo.

    Only the destination's tensor is scaled in place (it receives the result); the other ranks
    send a scaled copy, so their tensors are left as they were, as NCCL leaves them.
    """
    factor = _premul_factor(op, tensor, group) if op.__class__ is ReduceOp else None
    if factor is not None:
        op = _SUM
        if group_dst is not None:
            is_dst = _tdist.get_rank(group) == group_dst
        else:
            is_dst = _tdist.get_rank() == dst
        tensor = tensor.mul_(factor) if is_dst else tensor * factor
    if group_dst is None:
        # torch before 2.6 has no group_dst; passing it only when given keeps those working.
        return _torch_reduce(tensor, dst, op, group, async_op)
    return _torch_reduce(tensor, dst, op, group, async_op, group_dst)


def _reduce_scatter(
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    op: Any = _SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
) -> Optional[Work]:
    """``torch.distributed.reduce_scatter``; ``PREMUL_SUM`` also works on gloo."""
    factor = _premul_factor(op, output, group) if op.__class__ is ReduceOp else None
    if factor is not None:
        input_list = [t * factor for t in input_list]
        op = _SUM
    return _torch_reduce_scatter(output, input_list, op, group, async_op)


def _reduce_scatter_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    op: Any = _SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
) -> Optional[Work]:
    """``torch.distributed.reduce_scatter_tensor``; ``PREMUL_SUM`` also works on gloo."""
    input, op = _premultiplied(op, output, input, group)
    return _torch_reduce_scatter_tensor(output, input, op, group, async_op)


if hasattr(_tdist, "reduce_scatter_single"):  # torch >= 2.13
    _torch_reduce_scatter_single = _tdist.reduce_scatter_single

    def _reduce_scatter_single(
        output: torch.Tensor,
        input: torch.Tensor,
        op: Any = _SUM,
        group: Optional[ProcessGroup] = None,
        async_op: bool = False,
    ) -> Optional[Work]:
        """``torch.distributed.reduce_scatter_single``; ``PREMUL_SUM`` also works on gloo."""
        input, op = _premultiplied(op, output, input, group)
        return _torch_reduce_scatter_single(output, input, op, group, async_op)

    reduce_scatter_single = collective(
        "reduce_scatter_single", _reduce_scatter_single, "input", "op"
    )
    __all__ += ["reduce_scatter_single"]

all_reduce = collective("all_reduce", _all_reduce, "tensor", "op")
reduce = collective("reduce", _reduce, "tensor", "op")
reduce_scatter = collective("reduce_scatter", _reduce_scatter, "input_list", "op")
reduce_scatter_tensor = collective("reduce_scatter_tensor", _reduce_scatter_tensor, "input", "op")
all_reduce_coalesced = collective(
    "all_reduce_coalesced", _tdist.all_reduce_coalesced, "tensors", "op"
)
all_gather = collective("all_gather", _tdist.all_gather, "tensor")
all_gather_coalesced = collective(
    "all_gather_coalesced", _tdist.all_gather_coalesced, "input_tensor_list"
)
all_gather_into_tensor = collective(
    "all_gather_into_tensor", _tdist.all_gather_into_tensor, "input_tensor"
)
all_gather_object = collective("all_gather_object", _tdist.all_gather_object)
all_to_all = collective("all_to_all", _tdist.all_to_all, "input_tensor_list", dtypes_only=True)
all_to_all_single = collective(
    "all_to_all_single", _tdist.all_to_all_single, "input", dtypes_only=True
)
barrier = collective("barrier", _tdist.barrier)
monitored_barrier = collective("monitored_barrier", _tdist.monitored_barrier)
broadcast = collective("broadcast", _tdist.broadcast, "tensor")
broadcast_object_list = collective("broadcast_object_list", _tdist.broadcast_object_list)
gather = collective("gather", _tdist.gather, "tensor")
gather_object = collective("gather_object", _tdist.gather_object)
scatter = collective("scatter", _tdist.scatter, "tensor")
scatter_object_list = collective("scatter_object_list", _tdist.scatter_object_list)
send = p2p("send", _tdist.send, sending=True, is_async=False)
recv = p2p("recv", _tdist.recv, sending=False, is_async=False)
isend = p2p("isend", _tdist.isend, sending=True, is_async=True)
irecv = p2p("irecv", _tdist.irecv, sending=False, is_async=True)
send_object_list = p2p("send_object_list", _tdist.send_object_list, sending=True, is_async=False)
recv_object_list = p2p("recv_object_list", _tdist.recv_object_list, sending=False, is_async=False)
