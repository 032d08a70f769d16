"""What an optimizer keeps per parameter, learned from the optimizer itself.

One step on a three-element parameter tells which state tensors grow with the parameter
(``exp_avg``, ``momentum_buffer``, ``max_exp_avg_sq``) and which are fixed per parameter
(``step``), so every ``torch.optim`` optimizer and its hyper-parameters (``amsgrad``,
``momentum``) are covered without a table that could drift from torch.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class StateShape:
    """Optimizer state per parameter: bytes per element of the parameter's dtype, plus fixed
    bytes per parameter (scalars such as ``step``)."""

    per_element_bytes: int
    per_param_bytes: int


def optimizer_state(
    optimizer: type[torch.optim.Optimizer] | torch.optim.Optimizer | None,
) -> Callable[[torch.dtype], StateShape]:
    """A function from a parameter dtype to the state the optimizer keeps for it."""
    if optimizer is None:
        return lambda dtype: StateShape(0, 0)
    if isinstance(optimizer, torch.optim.Optimizer):
        cls = type(optimizer)
        # `defaults` may hold keys the constructor does not take (AdamW's
        # `decoupled_weight_decay`): pass on only the constructor's own arguments.
        accepted = inspect.signature(cls).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    elif inspect.isclass(optimizer) and issubclass(optimizer, torch.optim.Optimizer):
        cls, defaults = optimizer, {}
    else:
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer class or instance, got {optimizer!r}"
        )
    return functools.lru_cache(maxsize=None)(functools.partial(_probe_state, cls, defaults))


def _probe_state(
    cls: type[torch.optim.Optimizer], defaults: dict[str, Any], dtype: torch.dtype
) -> StateShape:
    """One step of the optimizer on a three-element parameter, read back: state tensors of the
    parameter's shape grow with it, the others are fixed per parameter."""
    param = torch.zeros(3, dtype=dtype, requires_grad=True)
    param.grad = torch.full_like(param, 0.5)
    opt = cls([param], **defaults)
    opt.step()
    per_element = per_param = 0
    for value in opt.state[param].values():
        if not isinstance(value, torch.Tensor):
            continue
        if value.shape == param.shape:
            per_element += value.element_size()
        else:
            per_param += value.numel() * value.element_size()
    return StateShape(per_element, per_param)
