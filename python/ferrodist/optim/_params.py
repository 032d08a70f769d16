"""Validation of the ``params`` and ``optimizer_class`` arguments of ``ZeroRedundancyOptimizer``.

The checks and their messages follow torch's so the same ``except`` clauses catch them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.optim.utils import functional_optim_map


def verify_params(params: Any) -> tuple[list[Any], list[torch.Tensor]]:
    """Materialise ``params`` and list every tensor in it.

    Returns:
        ``(params_as_list, all_tensors)``: the list handed to ``Optimizer.__init__`` and the flat
        list of parameters in registration order.

    Raises:
        TypeError: ``params`` is a tensor, not iterable, or mixes tensors and dicts.
        ValueError: ``params`` is empty or a group has no ``"params"`` key.
    """
    if isinstance(params, torch.Tensor):
        raise TypeError(
            f"`params` argument should be an iterable of Tensors, but got {torch.typename(params)}"
        )
    try:
        items = list(params)
    except TypeError as err:
        raise TypeError(
            "`params` argument should be an iterable of Tensors or dicts, "
            f"but got {torch.typename(params)}"
        ) from err
    if not items:
        raise ValueError("ZeroRedundancyOptimizer got an empty parameter list")
    if all(isinstance(p, torch.Tensor) for p in items):
        return items, list(items)
    if not all(isinstance(p, dict) for p in items):
        raise TypeError("`params` argument should be an iterable of Tensors or dicts")
    tensors: list[torch.Tensor] = []
    groups: list[Any] = []
    for group in items:
        if "params" not in group:
            raise ValueError(
                "Each parameter group passed-in via `params` must have a 'params' key mapping "
                "to the parameters in the group"
            )
        group_params = group["params"]
        if isinstance(group_params, torch.Tensor):
            tensors.append(group_params)
        elif not isinstance(group_params, set):  # a set is left to Optimizer's TypeError
            # Materialised in a copy: a generator (``model.parameters()``) would otherwise be
            # exhausted here and reach ``Optimizer.__init__`` empty (torch has that bug).
            group_params = list(group_params)
            tensors.extend(group_params)
            group = {**group, "params": group_params}
        else:
            tensors.extend(group_params)
        groups.append(group)
    return groups, tensors


def verify_same_dense_type(tensors: list[torch.Tensor]) -> None:
    """Raise ``ValueError`` unless every parameter has the first one's dense type."""
    typename = torch.typename(tensors[0])
    if tensors[0].is_sparse:
        raise ValueError(
            "ZeroRedundancyOptimizer only supports using the same dense type for all "
            f"parameters but got {typename}"
        )
    for tensor in tensors[1:]:
        other = torch.typename(tensor)
        if other != typename:
            raise ValueError(
                "ZeroRedundancyOptimizer only supports using the same dense type for all "
                f"parameters but got both {typename} and {other}"
            )


def resolve_optimizer_class(optimizer_class: Any, overlap_with_ddp: bool) -> Any:
    """The class the local optimizer is built from.

    Overlap mode steps with gradients handed over by DDP's hook, so it needs torch's functional
    counterpart of ``optimizer_class``; the normal mode needs the regular class.

    Raises:
        ValueError: a functional class without overlap, or a class with no functional
            counterpart in overlap mode.
    """
    functional = set(functional_optim_map.values())
    if not overlap_with_ddp:
        if optimizer_class in functional:
            raise ValueError(
                f"Passing in a functional optimizer {optimizer_class} when `overlap_with_ddp=False`"
            )
        return optimizer_class
    if optimizer_class in functional:
        return optimizer_class
    if optimizer_class in functional_optim_map:
        return functional_optim_map[optimizer_class]
    raise ValueError(
        "Using `ddp_with_overlap=True` requires using a functional optimizer, but there is "
        f"no supported functional optimizer equivalent for {optimizer_class}"
    )
