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
import sys
from collections.abc import Generator, Iterable, Iterator
from typing import Any, Callable, Optional, Union

import torch
from torch import nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    MixedPrecision,
    ShardingStrategy,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)
from torch.distributed.fsdp.api import OptimStateDictConfig

from ferrodist.debug._call_site import scope_of

from . import _construct, _prefetch, _runtime, _state_dict, _unshard
from ._construct import ProcessGroupArg
from ._flat import FlatHandle
from ._optim_api import OptimStateDictMethods
from ._shared import FLAT, HYBRID, WRAPPED, UnitBase, clean_name, units_under


class FullyShardedDataParallel(UnitBase, OptimStateDictMethods):
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
        self._group, self._inter_group = _construct.resolve_groups(
            process_group, strategy, device_mesh, auto_wrap_policy
        )
        # Kept for the state dicts: with a mesh, SHARDED ones hold DTensors (see _dtensor).
        self._device_mesh = device_mesh
        self.rank = self._group.rank()
        self.world_size = self._group.size()
        strategy = _construct.strategy_for_world(strategy, self.world_size)
        self.sharding_strategy = strategy
        data_parallel = self.world_size * (
            self._inter_group.size() if self._inter_group is not None else 1
        )
        self._predivide = _runtime.predivide_factor(data_parallel)
        self._postdivide = data_parallel / self._predivide
        ignored = _construct.ignored_params(module, ignored_modules, ignored_states)
        self.compute_device = _construct.compute_device(module, device_id, ignored)
        if self.compute_device.type != "cpu":
            _construct.move_to_device(module, self.compute_device, ignored)
        if param_init_fn is not None and any(p.is_meta for p in module.parameters()):
            param_init_fn(module)
        if auto_wrap_policy is not None:
            _construct.auto_wrap(
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
                FullyShardedDataParallel,
            )
        if sync_module_states:
            _construct.sync_module_states(module, self._group, ignored)
        self._fsdp_wrapped_module = module
        self._handle = _construct.make_handle(
            module,
            ignored,
            self._group,
            strategy,
            use_orig_params,
            self.mixed_precision,
            self.cpu_offload.offload_params,
        )
        if self._handle is not None and not use_orig_params:
            module.register_parameter(FLAT, self._handle.flat_param)
            self._handle.hide_params()
        elif self._handle is not None:
            self._handle.use_sharded_views()
        self._is_root: Optional[bool] = None
        self._all_units: list[FullyShardedDataParallel] = []
        self._root: Optional[FullyShardedDataParallel] = None
        self._reductions_in_flight: list[FlatHandle] = []
        self._prefetch_order = _prefetch.Order()
        self._sync_gradients = True
        self._handle_state = "idle"
        self._ran_pre_backward = False
        self._final_callback_queued = False
        self._post_backward_hook: Optional[tuple[Any, Any]] = None
        self._comm_hook: Optional[Callable[..., Any]] = None
        self._comm_hook_state: Any = None
        self._overlapped_optim: Any = None
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
        # The unit's ops are recorded at its caller's line, found once per forward.
        with scope_of(sys._getframe()):
            if self._is_root is None:
                _runtime.lazy_init_root(self)
            precision = self.mixed_precision
            if self._is_root:
                _runtime.root_pre_forward(self)
                args, kwargs = _runtime.move_inputs(self.compute_device, (args, kwargs))
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
        return units_under(module, root_only)

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

    def _register_overlapped_optim(self, hook_state: Any) -> None:
        """Step ``hook_state``'s functional optimizer on each unit right after its gradient
        is reduced (``_OverlappedStandardOptimizer.register_fsdp``); on the root, once."""
        if not self.check_is_root():
            raise AssertionError("an overlapped optimizer can only be registered on the root.")
        for unit in self.fsdp_modules(self):
            if unit._overlapped_optim is not None:
                raise AssertionError("An overlapped optimizer is already registered")
            unit._overlapped_optim = hook_state

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

    def named_flat_units(self) -> Iterator[tuple[str, FullyShardedDataParallel]]:
        """Every unit with its clean module prefix ('' for this one)."""
        for name, unit in self.named_modules():
            if isinstance(unit, FullyShardedDataParallel):
                yield clean_name(name), unit
