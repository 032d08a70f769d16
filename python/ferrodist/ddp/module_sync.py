"""Construction-time agreement across ranks: same parameters, then rank 0's values everywhere.

torch compares only sizes and stops at the first rank that notices, often leaving the other
ranks with a bare "connection closed". Here every rank gathers every rank's parameter names,
shapes and dtypes and raises the same error, naming the parameter and the ranks that differ.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as tdist

from ferrodist._recorded_ops import collective
from ferrodist.debug import _recorder as _flight
from ferrodist.errors import DistError

_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024
_all_gather_object = collective("ddp.all_gather_object", tdist.all_gather_object)


def _describe(names: Sequence[str], params: Sequence[torch.Tensor]) -> list[tuple[str, str]]:
    return [
        (name, f"{list(p.shape)} {str(p.dtype).replace('torch.', '')}")
        for name, p in zip(names, params)
    ]


def verify_params_across_ranks(
    process_group: Any,
    names: Sequence[str],
    params: Sequence[torch.Tensor],
    wrapper: str = "DDP",
) -> None:
    """Raise ``DistError`` (a ``RuntimeError``) on every rank if the models differ
    (``wrapper`` names the caller in the message: DDP, FSDP)."""
    mine = _describe(names, params)
    everyone: list[Any] = [None] * process_group.size()
    _all_gather_object(everyone, mine, group=process_group)
    reference = everyone[0]
    problems = []
    for rank, theirs in enumerate(everyone[1:], start=1):
        if len(theirs) != len(reference):
            problems.append(
                f"rank {rank} has {len(theirs)} parameters, while rank 0 has {len(reference)}"
            )
        for i, ((name0, shape0), (name, shape)) in enumerate(zip(reference, theirs)):
            if (name0, shape0) != (name, shape):
                problems.append(
                    f"parameter {i} is {name0!r} {shape0} on rank 0 but {name!r} {shape} "
                    f"on rank {rank}"
                )
                break
    if problems:
        raise DistError(
            f"{wrapper} expects same model across all ranks, but " + "; ".join(problems) + "."
        )


def broadcast_tensors(process_group: Any, tensors: Sequence[torch.Tensor], src: int) -> None:
    """Overwrite ``tensors`` with group rank ``src``'s values, in coalesced broadcasts."""
    if not tensors:
        return
    run = tdist._broadcast_coalesced  # type: ignore[attr-defined]
    args = (process_group, list(tensors), _BROADCAST_BUCKET_BYTES, src)
    with torch.no_grad():
        _flight.run("ddp.broadcast_coalesced", process_group, tensors, None, False, run, *args)
