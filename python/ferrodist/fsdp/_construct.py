"""Building an FSDP unit: process groups, ignored parameters, auto-wrapping, the flat handle.

Why apart from the class: these run once, at construction, and each follows one of torch's rules
(which group shards and which replicates, what counts as ignored, how policies wrap children,
which parameters a unit flattens and in what order); the class keeps the runtime surface.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp._wrap_utils import _auto_wrap as torch_auto_wrap

from ferrodist.ddp.module_sync import verify_params_across_ranks

from ._flat import FlatHandle, ParamSlot
from ._shared import HYBRID, is_unit

FLATTENED = "_ferrodist_fsdp_flattened"
"""Marks a parameter some unit has flattened, so enclosing units skip it (torch's rule)."""

ProcessGroupArg = Union[dist.ProcessGroup, tuple[dist.ProcessGroup, dist.ProcessGroup], None]


def resolve_groups(
    process_group: ProcessGroupArg,
    strategy: ShardingStrategy,
    device_mesh: Optional[Any],
    policy: Optional[Any],
) -> tuple[dist.ProcessGroup, Optional[dist.ProcessGroup]]:
    """The shard group and, for hybrid strategies, the replicate group (torch's rules)."""
    if process_group is not None and device_mesh is not None:
        raise ValueError(
            "Cannot pass both process_group and device_mesh at the "
            "same time. Please just pass only one of them."
        )
    if strategy in HYBRID:
        if device_mesh is not None:
            if device_mesh.ndim != 2:
                raise ValueError(f"Expected device_mesh to have ndim=2 but got {device_mesh.ndim}")
            return device_mesh.get_group(mesh_dim=1), device_mesh.get_group(mesh_dim=0)
        if process_group is None:
            if policy is None:
                raise ValueError(
                    f"Manual wrapping with {strategy} "
                    "requires explicit specification of process group or device_mesh."
                )
            raise ValueError(
                f"{strategy} on CPU needs an explicit (intra, inter) process_group or a 2-D "
                "device_mesh (torch derives the node groups from the CUDA device count)"
            )
        if not (
            isinstance(process_group, tuple)
            and len(process_group) == 2
            and all(isinstance(g, dist.ProcessGroup) for g in process_group)
        ):
            raise ValueError(
                "Expected process_group to be passed in as either None or "
                f"Tuple[dist.ProcessGroup, dist.ProcessGroup] but got {type(process_group)}"
            )
        return process_group[0], process_group[1]
    if device_mesh is not None:
        return device_mesh.get_group(mesh_dim=0), None
    if isinstance(process_group, tuple):
        raise ValueError(
            f"a (intra, inter) process_group tuple needs a hybrid sharding strategy, got {strategy}"
        )
    group = (
        process_group if process_group is not None else dist.distributed_c10d._get_default_group()
    )
    return group, None


def ignored_params(
    module: nn.Module,
    ignored_modules: Optional[Iterable[nn.Module]],
    ignored_states: Optional[Iterable[Any]],
) -> set[nn.Parameter]:
    if ignored_modules is not None and ignored_states is not None:
        raise ValueError(
            "Cannot pass both `ignored_modules` and `ignored_states` at the same time. "
            "Please just pass `ignored_states`."
        )
    params: set[nn.Parameter] = set()
    for item in list(ignored_modules or []) + list(ignored_states or []):
        if is_unit(item):
            raise ValueError("`ignored_modules` should not include FSDP modules")
        if isinstance(item, nn.Parameter):
            params.add(item)
        elif isinstance(item, nn.Module):
            params.update(item.parameters())
        else:
            raise TypeError(
                "`ignored_modules` expects an iterable of `torch.nn.Module`s "
                f"but got an iterable with {type(item)}"
            )
    return params


def auto_wrap(
    module: nn.Module,
    policy: Any,
    kwargs: dict[str, Any],
    ignored: set[nn.Parameter],
    ignored_modules: Optional[Iterable[nn.Module]],
    wrapper_cls: type[nn.Module],
) -> None:
    """Wrap submodules per torch's policy objects, with ``wrapper_cls`` (the FSDP class) as
    the wrapper."""
    for name, sub in module.named_modules():
        if is_unit(sub):
            raise ValueError(
                "FSDP auto wrapping requires modules to not already have "
                f"FSDP applied but found {name} in\n{module}"
            )
    torch_auto_wrap(
        module,
        policy,
        set(ignored_modules or []),
        ignored,
        kwargs,
        wrapper_cls,
    )


def sync_module_states(
    module: nn.Module, group: dist.ProcessGroup, ignored: set[nn.Parameter]
) -> None:
    """Broadcast parameters and buffers from the group's rank 0 (torch's sync_module_states)."""
    source = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for param in module.parameters():
            if param not in ignored and not getattr(param, FLATTENED, False):
                dist.broadcast(param.data, src=source, group=group)
        for buffer in module.buffers():
            dist.broadcast(buffer, src=source, group=group)


def strategy_for_world(strategy: ShardingStrategy, world_size: int) -> ShardingStrategy:
    """torch's clamp: a shard group of one rank runs NO_SHARD (with torch's warning). Hybrid
    strategies keep theirs: torch clamps them too and then skips the replicate group's
    all-reduce, so ranks on different nodes would stop averaging gradients."""
    if world_size != 1 or strategy in HYBRID or strategy == ShardingStrategy.NO_SHARD:
        return strategy
    warnings.warn(
        f"FSDP is switching to use `NO_SHARD` instead of {strategy} since the world size is 1.",
        stacklevel=4,
    )
    return ShardingStrategy.NO_SHARD


def compute_device(
    module: nn.Module, device_id: Optional[Union[int, torch.device]], ignored: set[nn.Parameter]
) -> torch.device:
    """Where the unit computes: ``device_id`` (an int names a CUDA device, as in torch), else
    the device of the module's (non-ignored) parameters, else the CPU."""
    if device_id is not None:
        device = torch.device("cuda", device_id) if isinstance(device_id, int) else device_id
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device
    for param in module.parameters():
        if param not in ignored and param.device.type != "meta":
            return param.device
    return torch.device("cpu")


def move_to_device(module: nn.Module, device: torch.device, ignored: set[nn.Parameter]) -> None:
    """Move the module's CPU parameters and buffers to the compute device (ignored ones stay);
    parameters already on another accelerator are the user's mistake and fail later."""
    for sub in module.modules():
        for param in sub._parameters.values():
            if param is not None and param not in ignored and param.device.type == "cpu":
                param.data = param.data.to(device)
        for name, buffer in sub._buffers.items():
            if buffer is not None and buffer.device.type == "cpu":
                sub._buffers[name] = buffer.to(device)


def make_handle(
    module: nn.Module,
    ignored: set[nn.Parameter],
    group: dist.ProcessGroup,
    strategy: ShardingStrategy,
    use_orig_params: bool,
    precision: MixedPrecision,
    offload_params: bool = False,
) -> Optional[FlatHandle]:
    """The flat parameter of every not-yet-flattened parameter in ``module``'s tree."""
    slots: list[ParamSlot] = []
    params: list[nn.Parameter] = []
    # A parameter met again under another module (tied weights) is flattened once; its other
    # attributes become shared slots that always show the first one's view, as torch's do.
    index_of: dict[int, int] = {}
    shared: list[tuple[ParamSlot, int]] = []
    seen: set[int] = set()
    for prefix, sub in module.named_modules():
        for name, param in list(sub._parameters.items()):
            if param is None or param in ignored:
                continue
            fqn = f"{prefix}.{name}" if prefix else name
            if id(param) in index_of:
                shared.append((ParamSlot(sub, name, fqn, param.shape), index_of[id(param)]))
                continue
            if id(param) in seen:
                continue
            seen.add(id(param))
            if getattr(param, FLATTENED, False):
                continue
            index_of[id(param)] = len(params)
            slots.append(ParamSlot(sub, name, fqn, param.shape))
            params.append(param)
    # Every rank must flatten the same parameters, or the all-gathers would mismatch: compare
    # names, shapes and dtypes now and name the parameter and the ranks that differ.
    verify_params_across_ranks(group, [s.fqn for s in slots], params, wrapper="FSDP")
    if not params:
        return None
    dtypes = {p.dtype for p in params}
    if len(dtypes) > 1:
        raise ValueError(
            f"Must flatten tensors with uniform dtype but got {sorted(map(str, dtypes))}"
        )
    if not use_orig_params and len({p.requires_grad for p in params}) > 1:
        names = [s.fqn for s, p in zip(slots, params) if not p.requires_grad]
        raise ValueError(
            "Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`; "
            f"frozen: {names}"
        )
    devices = {p.device for p in params}
    if len(devices) > 1:
        raise ValueError(
            "FSDP only supports single device modules but got params on "
            f"{sorted(map(str, devices))}"
        )
    handle = FlatHandle(
        slots,
        params,
        group,
        strategy != ShardingStrategy.NO_SHARD,
        use_orig_params,
        precision.param_dtype,
        precision.reduce_dtype,
        precision.keep_low_precision_grads,
        offload_params,
        shared,
    )
    for param in params:
        setattr(param, FLATTENED, True)
    setattr(handle.flat_param, FLATTENED, True)
    return handle
