"""The FULL model state dict of an FSDP tree: plain tensors under the original names, and back.

Why FULL is its own module: it is the format that moves between torch's FSDP and ferrodist's,
between world sizes, and into a model that is not sharded at all, and the SHARDED state dicts
(``_state_dict_sharded``) are built from it and loaded through it. It is taken by gathering
every unit (``_unshard.summon``), letting ``nn.Module`` walk the tree, then dropping the wrapper
segments and the flat parameters from the keys; loading is the reverse, with the gathered
tensors written back into each rank's shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.module import _IncompatibleKeys

from . import _unshard
from ._shared import FLAT, clean_name, units_under

if TYPE_CHECKING:
    from ._wrapper import FullyShardedDataParallel


class Walking:
    """Marks the units under a state-dict call, so nested ``state_dict`` calls go straight
    to ``nn.Module``'s walk instead of gathering again."""

    def __init__(self, units: list[FullyShardedDataParallel]) -> None:
        self.units = units

    def __enter__(self) -> None:
        for unit in self.units:
            unit._walking_state_dict = True

    def __exit__(self, *exc: object) -> None:
        for unit in self.units:
            unit._walking_state_dict = False


def full_state_dict(
    unit: FullyShardedDataParallel, rank0_only: bool, offload: bool, *args: Any, **kwargs: Any
) -> Any:
    """Every unit gathered; plain clones of the parameters under their original names."""
    units = units_under(unit)
    with _unshard.summon(unit, recurse=True, writeback=False), Walking(units):
        raw = nn.Module.state_dict(unit, *args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        param_keys = {
            prefix + name for name, _ in nn.Module.named_parameters(unit, remove_duplicate=False)
        }
        # Buffers mixed precision cast come back in their original dtype, as torch's do.
        buffer_dtypes = {
            prefix + name: buffer._fsdp_orig_dtype
            for name, buffer in nn.Module.named_buffers(unit)
            if hasattr(buffer, "_fsdp_orig_dtype")
        }
        out = type(raw)()
        for key, value in raw.items():
            if key == FLAT or key.endswith("." + FLAT):
                continue
            if not isinstance(value, torch.Tensor):
                out[clean_name(key)] = value
                continue
            tensor = value.detach().clone() if key in param_keys else value
            if key in buffer_dtypes:
                tensor = tensor.to(buffer_dtypes[key]).clone()
            if offload:
                tensor = tensor.cpu()
            out[clean_name(key)] = tensor
    if rank0_only and dist.get_rank() != 0:
        return type(raw)()
    return out


def load_full_state_dict(
    unit: FullyShardedDataParallel, state: Any, strict: bool
) -> _IncompatibleKeys:
    """Load a FULL state dict: every unit gathered, the values written under their prefixed
    names, each rank's shard rewritten from the result."""
    units = units_under(unit)
    with _unshard.summon(unit, recurse=True, writeback=True), Walking(units):
        names = [n for n, _ in nn.Module.named_parameters(unit, remove_duplicate=False)] + [
            n for n, _ in nn.Module.named_buffers(unit)
        ]
        prefixed = {clean_name(n): n for n in names if not n.endswith(FLAT)}
        translated = {prefixed.get(k, k): v for k, v in state.items()}
        result = nn.Module.load_state_dict(unit, translated, strict=False)
    missing = [clean_name(k) for k in result.missing_keys if not k.endswith(FLAT)]
    unexpected = [clean_name(k) for k in result.unexpected_keys]
    return check_strict(unit, missing, unexpected, strict)


def check_strict(
    unit: FullyShardedDataParallel, missing: list[str], unexpected: list[str], strict: bool
) -> _IncompatibleKeys:
    """nn.Module's strict-loading error, with clean names."""
    if strict and (missing or unexpected):
        lines = []
        if unexpected:
            lines.append(
                "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". "
            )
        if missing:
            lines.append(
                "Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". "
            )
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(unit).__name__}:\n\t" + "\n\t".join(lines)
        )
    return _IncompatibleKeys(missing, unexpected)
