"""Moving one rank's optimizer-state shard to another rank, tensor by tensor.

torch's ``consolidate_state_dict`` pickles each shard with ``torch.save``, broadcasts the bytes
to *every* rank, and every rank unpickles them; the receiving rank keeps all shards until
``state_dict()`` is called. That costs several copies of a shard on the sender, the serialized
bytes plus the unpickled copy on every receiver, and the time of ``world_size - 1`` useless
deserializations.

Here a shard travels point to point (``send``/``recv``, which gloo and NCCL both support):

1. a small header, pickled: the shard's structure with every large tensor replaced by a
   :class:`TensorSlot` (shape and dtype); 0-dim tensors such as Adam's ``step`` ride inline;
2. each large tensor, sent as it is (no copy when contiguous) and received straight into the
   tensor that becomes part of the consolidated output.

So the receiving rank holds the output plus one header at a time, and the other ranks hold
nothing extra.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ferrodist.debug import _recorder as _flight


@dataclass(frozen=True)
class TensorSlot:
    """Placeholder for a tensor that follows the header as its own message."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def _strip_tensors(value: Any, tensors: list[torch.Tensor]) -> Any:
    """``value`` with every non-scalar tensor replaced by a slot (appended to ``tensors``)."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return value.detach().cpu()
        tensors.append(value.detach())
        return TensorSlot(len(tensors) - 1, tuple(value.shape), value.dtype)
    if isinstance(value, dict):
        return {k: _strip_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_strip_tensors(v, tensors) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _fill_slots(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, TensorSlot):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: _fill_slots(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_fill_slots(v, tensors) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _slots(value: Any) -> list[TensorSlot]:
    if isinstance(value, TensorSlot):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _slots(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _slots(v)]
    return []


def send_shard(shard: Any, dst: int, group: Any, device: torch.device) -> None:
    """Send ``shard`` (any structure holding tensors) to global rank ``dst``.

    ``device`` is the device the backend moves tensors through (CPU for gloo, the GPU for NCCL).
    """
    tensors: list[torch.Tensor] = []
    header = pickle.dumps(_strip_tensors(shard, tensors), protocol=pickle.HIGHEST_PROTOCOL)
    header_tensor = torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device)
    _send(torch.tensor([len(header)], dtype=torch.int64, device=device), dst, group)
    _send(header_tensor, dst, group)
    del header, header_tensor
    for tensor in tensors:
        _send(tensor.to(device).contiguous(), dst, group)


def _send(tensor: torch.Tensor, dst: int, group: Any) -> None:
    _flight.run_p2p("zero", group, dst, True, tensor, dist.send, tensor, dst, group)


def _recv(tensor: torch.Tensor, src: int, group: Any) -> None:
    _flight.run_p2p("zero", group, src, False, tensor, dist.recv, tensor, src, group)


def recv_shard(src: int, group: Any, device: torch.device) -> Any:
    """Receive a shard sent by :func:`send_shard` from global rank ``src``; tensors land on CPU."""
    length = torch.zeros(1, dtype=torch.int64, device=device)
    _recv(length, src, group)
    header_tensor = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    _recv(header_tensor, src, group)
    structure = pickle.loads(header_tensor.cpu().numpy().tobytes())
    del header_tensor
    tensors: list[torch.Tensor] = []
    for slot in sorted(_slots(structure), key=lambda s: s.index):
        if device.type == "cpu":
            out = torch.empty(slot.shape, dtype=slot.dtype)
            _recv(out, src, group)
        else:
            staging = torch.empty(slot.shape, dtype=slot.dtype, device=device)
            _recv(staging, src, group)
            out = staging.cpu()
            del staging
        tensors.append(out)
    return _fill_slots(structure, tensors)


def snapshot(value: Any) -> Any:
    """A CPU copy of ``value`` that later in-place optimizer updates cannot change."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [snapshot(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value
