"""torch 2.13's optimizer state-dict methods of ``FullyShardedDataParallel``, as static methods.

Why a base class of its own: the wrapper holds the module plumbing and the runtime; these
methods only translate optimizer state dicts between the optimizer's flat or sliced view and the
name-keyed forms torch defines (FULL: whole tensors; SHARDED and LOCAL: ``ShardedTensor``
chunks). Which form ``optim_state_dict`` gives and ``optim_state_dict_to_load`` takes follows
the model's state-dict type, as in torch; the older names (``full_optim_state_dict``,
``sharded_optim_state_dict``...) are kept with torch's signatures and deprecation warnings.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import OptimStateKeyType, StateDictType

from . import _optim_state, _optim_state_sharded, _state_dict
from ._shared import units_under


def _warn_legacy(old: str, new: str) -> None:
    # torch's wording, so filters written for torch's warning match ferrodist's too.
    warnings.warn(
        f"``FullyShardedDataParallel.{old}``is being deprecated and is replaced by "
        f"``FullyShardedDataParallel.{new}``. ``FullyShardedDataParallel.{old}`` may be "
        "removed after PyTorch 2.2.",
        FutureWarning,
        stacklevel=3,
    )


def _check_same_orig_params(model: nn.Module) -> None:
    units = units_under(model)
    if units and not all(u._use_orig_params == units[0]._use_orig_params for u in units):
        raise AssertionError("Not all FSDP modules have the same _use_orig_params value")


def _to_load(model: nn.Module, optim: Optional[Any], osd: dict[str, Any]) -> dict[str, Any]:
    """Any name-keyed optimizer state dict (chunks gathered first) cut to this rank's view."""
    _check_same_orig_params(model)
    full = _optim_state_sharded.gathered(model, osd)
    return _optim_state.optim_state_dict_to_load(model, optim, full)


class OptimStateDictMethods:
    """The optimizer state-dict static methods of torch's ``FullyShardedDataParallel``."""

    @staticmethod
    def optim_state_dict(
        model: nn.Module,
        optim: torch.optim.Optimizer,
        optim_state_dict: Optional[dict[str, Any]] = None,
        group: Optional[dist.ProcessGroup] = None,
    ) -> dict[str, Any]:
        """The optimizer state dict of the model's state-dict type, keyed by original names:
        whole tensors for FULL, dim-0 ``ShardedTensor`` chunks for SHARDED and LOCAL."""
        settings = _state_dict.get_type(model)
        config = settings.optim_state_dict_config
        _check_same_orig_params(model)
        if settings.state_dict_type != StateDictType.FULL_STATE_DICT:
            return _optim_state_sharded.sharded_optim_state_dict(
                model,
                optim,
                optim_state_dict,
                offload_to_cpu=bool(getattr(config, "offload_to_cpu", True)),
            )
        return _optim_state.full_optim_state_dict(
            model,
            optim,
            optim_state_dict,
            rank0_only=bool(getattr(config, "rank0_only", False)),
            offload_to_cpu=bool(getattr(config, "offload_to_cpu", False)),
        )

    @staticmethod
    def full_optim_state_dict(
        model: nn.Module,
        optim: torch.optim.Optimizer,
        optim_input: Optional[Any] = None,
        rank0_only: bool = True,
        group: Optional[dist.ProcessGroup] = None,
    ) -> dict[str, Any]:
        """The FULL optimizer state dict (on rank 0 only by default; ``{}`` elsewhere)."""
        return _optim_state.full_optim_state_dict(model, optim, None, rank0_only=rank0_only)

    @staticmethod
    def sharded_optim_state_dict(
        model: nn.Module,
        optim: torch.optim.Optimizer,
        group: Optional[dist.ProcessGroup] = None,
    ) -> dict[str, Any]:
        """Deprecated name of ``optim_state_dict`` under SHARDED_STATE_DICT (offloaded)."""
        _warn_legacy("sharded_optim_state_dict", "optim_state_dict")
        _check_same_orig_params(model)
        return _optim_state_sharded.sharded_optim_state_dict(
            model, optim, None, offload_to_cpu=True
        )

    @staticmethod
    def optim_state_dict_to_load(
        model: nn.Module,
        optim: torch.optim.Optimizer,
        optim_state_dict: dict[str, Any],
        is_named_optimizer: bool = False,
        load_directly: bool = False,
        group: Optional[dist.ProcessGroup] = None,
    ) -> dict[str, Any]:
        """This rank's ``optim.load_state_dict`` input from an ``optim_state_dict`` result
        (FULL, SHARDED or LOCAL)."""
        _state_dict.get_type(model)  # torch's check: one setting for every unit
        result = _to_load(model, optim, optim_state_dict)
        if load_directly:
            optim.load_state_dict(result)
        return result

    @staticmethod
    def flatten_sharded_optim_state_dict(
        sharded_optim_state_dict: dict[str, Any],
        model: nn.Module,
        optim: torch.optim.Optimizer,
    ) -> dict[str, Any]:
        """Deprecated name of ``optim_state_dict_to_load`` for a SHARDED optimizer state dict
        (every rank all-gathers the chunks)."""
        _warn_legacy("flatten_sharded_optim_state_dict", "optim_state_dict_to_load")
        return _to_load(model, optim, sharded_optim_state_dict)

    @staticmethod
    def shard_full_optim_state_dict(
        full_optim_state_dict: dict[str, Any],
        model: nn.Module,
        optim_input: Optional[Any] = None,
        optim: Optional[torch.optim.Optimizer] = None,
    ) -> dict[str, Any]:
        """A FULL optimizer state dict cut to this rank's shards, ready to load."""
        return _optim_state.optim_state_dict_to_load(model, optim, full_optim_state_dict)

    @staticmethod
    def scatter_full_optim_state_dict(
        full_optim_state_dict: Optional[dict[str, Any]],
        model: nn.Module,
        optim_input: Optional[Any] = None,
        optim: Optional[torch.optim.Optimizer] = None,
        group: Optional[Any] = None,
    ) -> dict[str, Any]:
        """Rank 0's FULL optimizer state dict, sent to every rank and cut to its shards."""
        full = _optim_state.broadcast_full(full_optim_state_dict, model)
        return _optim_state.optim_state_dict_to_load(model, optim, full)

    @staticmethod
    def rekey_optim_state_dict(
        optim_state_dict: dict[str, Any],
        optim_state_key_type: OptimStateKeyType,
        model: nn.Module,
        optim_input: Optional[Any] = None,
        optim: Optional[torch.optim.Optimizer] = None,
    ) -> dict[str, Any]:
        """A FULL optimizer state dict re-keyed by parameter names or by parameter ids."""
        return _optim_state.rekey(optim_state_dict, optim_state_key_type, model, optim)
