"""``FullyShardedDataParallel``: torch 2.13's FSDP constructor and methods, ferrodist's runtime.

The wrapper keeps torch's module shape, so everything that walks a model sees torch's names: the
wrapped module is the child ``_fsdp_wrapped_module``, the flat parameter (``use_orig_params=False``)
is that child's ``_flat_param``, and ``state_dict()`` gives the original, unprefixed names. The
configuration types (``ShardingStrategy``, ``MixedPrecision``, the state-dict configs...) are
torch's objects; the flat layout comes from Rust (``_layout``), the tensor traffic from torch's
collectives on ferrodist's (that is, torch's) process groups.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterable, Iterator
from typing import Any, Callable, Optional, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    MixedPrecision,
    OptimStateKeyType,
    ShardingStrategy,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)
from torch.distributed.fsdp.api import OptimStateDictConfig

from ferrodist.ddp.module_sync import verify_params_across_ranks

from . import _optim_state, _runtime, _state_dict, _unshard
from ._flat import FlatHandle, ParamSlot
from ._runtime import HYBRID

WRAPPED = "_fsdp_wrapped_module"
FLAT = "_flat_param"
_FLATTENED = "_ferrodist_fsdp_flattened"

ProcessGroupArg = Union[dist.ProcessGroup, tuple[dist.ProcessGroup, dist.ProcessGroup], None]


class FullyShardedDataParallel(nn.Module):
    """Shards a module's parameters across ranks (torch's ``FullyShardedDataParallel``).

    Arguments and behaviour are torch 2.13's: each wrapped unit holds its parameters as one flat
    parameter of which every rank keeps a 1/world slice; the forward and backward gather the
    whole parameter just in time and reduce-scatter the gradient. See torch's documentation for
    the arguments; ferrodist runs the same arithmetic, so results are bit-identical to torch's.
    """

    _summoning: bool = False
    """Set while ``summon_full_params`` holds this unit's parameters whole: names are clean."""

    _walking_state_dict: bool = False
    """Set on every unit while a state-dict call walks the tree (see ``_state_dict``)."""

    def __init__(
        self,
        module: nn.Module,
        process_group: ProcessGroupArg = None,
        sharding_strategy: Optional[ShardingStrategy] = None,
        cpu_offload: Optional[CPUOffload] = None,
        auto_wrap_policy: Optional[Callable[..., Any]] = None,
        backward_prefetch: Optional[BackwardPrefetch] = BackwardPrefetch.BACKWARD_PRE,
        mixed_precision: Optional[MixedPrecision] = None,
        ignored_modules: Optional[Iterable[nn.Module]] = None,
        param_init_fn: Optional[Callable[[nn.Module], None]] = None,
        device_id: Optional[Union[int, torch.device]] = None,
        sync_module_states: bool = False,
        forward_prefetch: bool = False,
        limit_all_gathers: bool = True,
        use_orig_params: bool = False,
        ignored_states: Optional[Iterable[Any]] = None,
        device_mesh: Optional[Any] = None,
    ) -> None:
        super().__init__()
        if isinstance(module, FullyShardedDataParallel) and auto_wrap_policy is not None:
            raise ValueError("FSDP auto wrapping requires modules to not already have FSDP applied")
        strategy = sharding_strategy or ShardingStrategy.FULL_SHARD
        self.sharding_strategy = strategy
        self.cpu_offload = cpu_offload or CPUOffload()
        self.backward_prefetch = backward_prefetch
        self.mixed_precision = mixed_precision or MixedPrecision()
        self.forward_prefetch = forward_prefetch
        self.limit_all_gathers = limit_all_gathers
        self._use_orig_params = use_orig_params
        self._group, self._inter_group = _resolve_groups(
            process_group, strategy, device_mesh, auto_wrap_policy
        )
        self.rank = self._group.rank()
        self.world_size = self._group.size()
        data_parallel = self.world_size * (
            self._inter_group.size() if self._inter_group is not None else 1
        )
        self._predivide = _runtime.predivide_factor(data_parallel)
        self._postdivide = data_parallel / self._predivide
        ignored = _ignored_params(module, ignored_modules, ignored_states)
        if device_id is not None:
            device = torch.device(device_id) if not isinstance(device_id, int) else None
            if device is not None and device.type != "cpu":
                module = module.to(device)
        if param_init_fn is not None and any(p.is_meta for p in module.parameters()):
            param_init_fn(module)
        if auto_wrap_policy is not None:
            _auto_wrap(
                module,
                auto_wrap_policy,
                dict(
                    process_group=process_group,
                    sharding_strategy=sharding_strategy,
                    cpu_offload=cpu_offload,
                    backward_prefetch=backward_prefetch,
                    mixed_precision=mixed_precision,
                    param_init_fn=param_init_fn,
                    device_id=device_id,
                    sync_module_states=sync_module_states,
                    forward_prefetch=forward_prefetch,
                    limit_all_gathers=limit_all_gathers,
                    use_orig_params=use_orig_params,
                    ignored_states=ignored_states,
                    device_mesh=device_mesh,
                ),
                ignored,
                ignored_modules,
            )
        if sync_module_states:
            _sync_module_states(module, self._group, ignored)
        self._fsdp_wrapped_module = module
        self._handle = _make_handle(
            module, ignored, self._group, strategy, use_orig_params, self.mixed_precision
        )
        if self._handle is not None and not use_orig_params:
            module.register_parameter(FLAT, self._handle.flat_param)
            self._handle.hide_params()
        elif self._handle is not None:
            self._handle.use_sharded_views()
        self._is_root: Optional[bool] = None
        self._all_units: list[FullyShardedDataParallel] = []
        self._sync_gradients = True
        self._handle_state = "idle"
        self._ran_pre_backward = False
        self._final_callback_queued = False
        self._post_backward_hook: Optional[tuple[Any, Any]] = None
        self._comm_hook: Optional[Callable[..., Any]] = None
        self._comm_hook_state: Any = None
        self._state_dict_type = StateDictType.FULL_STATE_DICT
        self._state_dict_config: StateDictConfig = _state_dict.default_config(
            StateDictType.FULL_STATE_DICT
        )
        self._optim_state_dict_config: OptimStateDictConfig = _state_dict.default_optim_config(
            StateDictType.FULL_STATE_DICT
        )

    # ----- module plumbing -----

    @property
    def module(self) -> nn.Module:
        """The wrapped module."""
        return self._fsdp_wrapped_module

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == WRAPPED:
                raise
            return getattr(self._fsdp_wrapped_module, name)

    def __getitem__(self, key: int) -> Any:
        return self._fsdp_wrapped_module.__getitem__(key)  # type: ignore[operator]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the wrapped module with its parameters gathered (see the module doc)."""
        if self._is_root is None:
            _runtime.lazy_init_root(self)
        precision = self.mixed_precision
        if self._is_root:
            _runtime.root_pre_forward(self)
            if precision.cast_root_forward_inputs:
                args, kwargs = _runtime.cast_inputs(precision.param_dtype, (args, kwargs))
        if precision.cast_forward_inputs:
            args, kwargs = _runtime.cast_inputs(precision.param_dtype, (args, kwargs))
        _runtime.pre_forward(self)
        output = self._fsdp_wrapped_module(*args, **kwargs)
        return _runtime.post_forward(self, output)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Parameter]]:
        """``nn.Module.named_parameters``; inside ``summon_full_params`` without the wrapper
        segments in the names, as torch's FSDP does."""
        for name, param in super().named_parameters(*args, **kwargs):
            yield (name.replace(WRAPPED + ".", "") if self._summoning else name), param

    def named_buffers(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, torch.Tensor]]:
        """``nn.Module.named_buffers``, names cleaned as in ``named_parameters``."""
        for name, buffer in super().named_buffers(*args, **kwargs):
            yield (name.replace(WRAPPED + ".", "") if self._summoning else name), buffer

    def check_is_root(self) -> bool:
        """Whether this instance is the root (lazily decided at the first forward)."""
        if self._is_root is None:
            _runtime.lazy_init_root(self)
        return bool(self._is_root)

    @staticmethod
    def fsdp_modules(module: nn.Module, root_only: bool = False) -> list[FullyShardedDataParallel]:
        """Every FSDP instance in ``module``'s tree (only the outermost ones with ``root_only``)."""
        found = [m for m in module.modules() if isinstance(m, FullyShardedDataParallel)]
        if not root_only:
            return found
        inner = {id(sub) for m in found for sub in m.modules() if sub is not m}
        return [m for m in found if id(m) not in inner]

    def apply(self, fn: Callable[[nn.Module], None]) -> FullyShardedDataParallel:
        """``nn.Module.apply`` with the parameters gathered, so ``fn`` sees full tensors."""
        with _unshard.summon(self, recurse=False, writeback=True):
            super().apply(fn)
        return self

    @contextlib.contextmanager
    def no_sync(self) -> Generator[None, None, None]:
        """Accumulate unreduced gradients across backwards (call on the root)."""
        units = self.fsdp_modules(self)
        previous = [unit._sync_gradients for unit in units]
        for unit in units:
            unit._sync_gradients = False
        try:
            yield
        finally:
            for unit, value in zip(units, previous):
                unit._sync_gradients = value

    def register_comm_hook(self, state: object, hook: Callable[..., Any]) -> None:
        """Replace the gradient reduction of every unit (on the root, before the first step)."""
        if not self.check_is_root():
            raise AssertionError("register_comm_hook can only be called on a root instance.")
        for unit in self.fsdp_modules(self):
            if unit.sharding_strategy in HYBRID:
                raise AssertionError(
                    f"Communication hook is not supported for hybrid strategies: "
                    f"{unit.sharding_strategy}"
                )
            if unit._comm_hook is not None:
                raise AssertionError("A communication hook is already registered")
            unit._comm_hook = hook
            unit._comm_hook_state = state

    # ----- full parameters -----

    @staticmethod
    @contextlib.contextmanager
    def summon_full_params(
        module: nn.Module,
        recurse: bool = True,
        writeback: bool = True,
        rank0_only: bool = False,
        offload_to_cpu: bool = False,
        with_grads: bool = False,
    ) -> Generator[None, None, None]:
        """The original parameters, whole, as module attributes, for the ``with`` body."""
        with _unshard.summon(module, recurse, writeback, rank0_only, offload_to_cpu, with_grads):
            yield

    @torch.no_grad()
    def clip_grad_norm_(
        self, max_norm: Union[float, int], norm_type: Union[float, int] = 2.0
    ) -> torch.Tensor:
        """Clip the gradient norm over all ranks' shards (torch's arithmetic)."""
        return _unshard.clip_grad_norm(self, float(max_norm), float(norm_type))

    # ----- state dicts -----

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The model's state dict of the current type, keyed by the original names."""
        return _state_dict.state_dict(self, *args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load a state dict of the current type, keyed by the original names."""
        return _state_dict.load_state_dict(self, state_dict, strict)

    @staticmethod
    def set_state_dict_type(
        module: nn.Module,
        state_dict_type: StateDictType,
        state_dict_config: Optional[StateDictConfig] = None,
        optim_state_dict_config: Optional[OptimStateDictConfig] = None,
    ) -> StateDictSettings:
        """Set the state dict type of every unit; returns the previous settings."""
        return _state_dict.set_type(
            module, state_dict_type, state_dict_config, optim_state_dict_config
        )

    @staticmethod
    def get_state_dict_type(module: nn.Module) -> StateDictSettings:
        """The state dict settings every unit in ``module`` shares."""
        return _state_dict.get_type(module)

    @staticmethod
    @contextlib.contextmanager
    def state_dict_type(
        module: nn.Module,
        state_dict_type: StateDictType,
        state_dict_config: Optional[StateDictConfig] = None,
        optim_state_dict_config: Optional[OptimStateDictConfig] = None,
    ) -> Generator[None, None, None]:
        """Use ``state_dict_type`` for the ``with`` body."""
        previous = FullyShardedDataParallel.set_state_dict_type(
            module, state_dict_type, state_dict_config, optim_state_dict_config
        )
        try:
            yield
        finally:
            FullyShardedDataParallel.set_state_dict_type(
                module,
                previous.state_dict_type,
                previous.state_dict_config,
                previous.optim_state_dict_config,
            )

    # ----- optimizer state dicts (FULL) -----

    @staticmethod
    def optim_state_dict(
        model: nn.Module,
        optim: torch.optim.Optimizer,
        optim_state_dict: Optional[dict[str, Any]] = None,
        group: Optional[dist.ProcessGroup] = None,
    ) -> dict[str, Any]:
        """The optimizer state dict of the model's state-dict type (FULL: keyed by names)."""
        settings = FullyShardedDataParallel.get_state_dict_type(model)
        if settings.state_dict_type != StateDictType.FULL_STATE_DICT:
            raise NotImplementedError(
                f"ferrodist FSDP: {settings.state_dict_type} optimizer state is not implemented"
            )
        config = settings.optim_state_dict_config
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
    def optim_state_dict_to_load(
        model: nn.Module,
        optim: torch.optim.Optimizer,
        optim_state_dict: dict[str, Any],
        is_named_optimizer: bool = False,
        load_directly: bool = False,
        group: Optional[dist.ProcessGroup] = None,
    ) -> dict[str, Any]:
        """This rank's ``optim.load_state_dict`` input from a FULL state dict."""
        result = _optim_state.optim_state_dict_to_load(model, optim, optim_state_dict)
        if load_directly:
            optim.load_state_dict(result)
        return result

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

    def named_flat_units(self) -> Iterator[tuple[str, FullyShardedDataParallel]]:
        """Every unit with its clean module prefix ('' for this one)."""
        for name, unit in self.named_modules():
            if isinstance(unit, FullyShardedDataParallel):
                yield clean_name(name), unit


def clean_name(name: str) -> str:
    """``name`` without the wrapper segments (torch's clean FQN)."""
    parts = [part for part in name.split(".") if part and part != WRAPPED]
    return ".".join(parts)


def _resolve_groups(
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


def _ignored_params(
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
        if isinstance(item, FullyShardedDataParallel):
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


def _auto_wrap(
    module: nn.Module,
    policy: Any,
    kwargs: dict[str, Any],
    ignored: set[nn.Parameter],
    ignored_modules: Optional[Iterable[nn.Module]],
) -> None:
    """Wrap submodules per torch's policy objects, with this class as the wrapper."""
    from torch.distributed.fsdp._wrap_utils import _auto_wrap as torch_auto_wrap

    for name, sub in module.named_modules():
        if isinstance(sub, FullyShardedDataParallel):
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
        FullyShardedDataParallel,
    )


def _sync_module_states(
    module: nn.Module, group: dist.ProcessGroup, ignored: set[nn.Parameter]
) -> None:
    """Broadcast parameters and buffers from the group's rank 0 (torch's sync_module_states)."""
    source = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for param in module.parameters():
            if param not in ignored and not getattr(param, _FLATTENED, False):
                dist.broadcast(param.data, src=source, group=group)
        for buffer in module.buffers():
            dist.broadcast(buffer, src=source, group=group)


def _make_handle(
    module: nn.Module,
    ignored: set[nn.Parameter],
    group: dist.ProcessGroup,
    strategy: ShardingStrategy,
    use_orig_params: bool,
    precision: MixedPrecision,
) -> Optional[FlatHandle]:
    """The flat parameter of every not-yet-flattened parameter in ``module``'s tree."""
    slots: list[ParamSlot] = []
    params: list[nn.Parameter] = []
    seen: set[int] = set()
    for prefix, sub in module.named_modules():
        for name, param in list(sub._parameters.items()):
            if param is None or id(param) in seen or param in ignored:
                continue
            seen.add(id(param))
            if getattr(param, _FLATTENED, False):
                continue
            slots.append(ParamSlot(sub, name, f"{prefix}.{name}" if prefix else name, param.shape))
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
    )
    for param in params:
        setattr(param, _FLATTENED, True)
    setattr(handle.flat_param, _FLATTENED, True)
    return handle
