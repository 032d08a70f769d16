"""Overlapped optimizers: an optimizer that registers itself into DDP's backward pass.

``register_overlapped(optim_cls)`` maps an optimizer class to an :class:`OverlappedOptimizer`
implementation; :func:`_as_overlapped_optim` finds the closest one along the class's MRO and
falls back to :class:`_OverlappedStandardOptimizer`, which steps a functional optimizer in DDP's
communication hook. Works with any DDP exposing ``register_comm_hook`` (torch's or ferrodist's),
and with ferrodist's FSDP (each unit stepped right after its reduce-scatter).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.optim import as_functional_optim
from torch.optim import Optimizer

from ferrodist.algorithms.ddp_comm_hooks.optimizer_overlap_hooks import (
    _hook_then_optimizer,
    _OptimizerHookState,
)

__all__ = ["OverlappedOptimizer", "register_overlapped"]

_registered_overlapped_optims: dict[type, type] = {}


def register_overlapped(optim_cls: type) -> Callable[[type], type]:
    """Class decorator: use the decorated class to overlap ``optim_cls``.

    Raises:
        ValueError: the decorated class is already registered.
    """

    def decorator(overlapped_cls: type) -> type:
        # torch only looks the class up among the *keys* (optimizer classes), so a second
        # registration slips through there; here it raises as documented.
        registered_for = [
            k for k, v in _registered_overlapped_optims.items() if v is overlapped_cls
        ]
        if registered_for or overlapped_cls in _registered_overlapped_optims:
            raise ValueError(
                f"{overlapped_cls} already registered with optim_cls "
                f"{registered_for[0] if registered_for else overlapped_cls} {optim_cls}, trying "
                f"to re-register it for {optim_cls} is not supported."
            )
        _registered_overlapped_optims[optim_cls] = overlapped_cls
        return overlapped_cls

    return decorator


class OverlappedOptimizer(ABC):
    """Base class: says how an optimizer hooks itself into DDP or FSDP."""

    def __init__(self, optim_cls: type) -> None:
        self.optim_cls = optim_cls

    @abstractmethod
    def register_ddp(self, ddp: Any) -> None:
        """Register the overlapped optimizer with a DDP instance."""
        raise NotImplementedError(f"{self.__class__.__name__} does not support overlapped DDP.")

    @abstractmethod
    def register_fsdp(self, fsdp: Any) -> None:
        """Register the overlapped optimizer with an FSDP instance."""
        raise NotImplementedError(f"{self.__class__.__name__} does not support overlapped FSDP.")


@register_overlapped(Optimizer)
class _OverlappedStandardOptimizer(OverlappedOptimizer):
    """Overlaps any ``torch.optim`` optimizer that has a functional counterpart.

    Raises:
        ValueError: ``optim_cls`` has no functional counterpart.
    """

    def __init__(self, optim_cls: type, params: Any, *optim_args: Any, **optim_kwargs: Any) -> None:
        super().__init__(optim_cls)
        functional = as_functional_optim(self.optim_cls, *optim_args, **optim_kwargs)
        self._opt_hook_state = _OptimizerHookState(functional, params)

    def register_ddp(self, ddp_inst: Any) -> None:
        """Install the all-reduce-then-step hook as ``ddp_inst``'s communication hook."""
        ddp_inst.register_comm_hook(
            None, _hook_then_optimizer(allreduce_hook, self._opt_hook_state)
        )

    def register_fsdp(self, fsdp: Any) -> None:
        """Step each unit of ferrodist's FSDP as soon as its gradient is reduced (torch's
        raises ``NotImplementedError``; so does this for torch's own FSDP)."""
        from ferrodist.fsdp import FullyShardedDataParallel

        if not isinstance(fsdp, FullyShardedDataParallel):
            raise NotImplementedError(
                f"{self.__class__.__name__} does not support overlapped FSDP."
            )
        fsdp._register_overlapped_optim(self._opt_hook_state)


def _as_overlapped_optim(optim_cls: type, params: Any, *args: Any, **kwargs: Any) -> Any:
    """A new overlapped optimizer for ``optim_cls``: first registry hit along its MRO."""
    for cls in inspect.getmro(optim_cls):
        overlapped = _registered_overlapped_optims.get(cls)
        if overlapped is not None:
            return overlapped(optim_cls, params, *args, **kwargs)
    return _OverlappedStandardOptimizer(optim_cls, params, *args, **kwargs)
