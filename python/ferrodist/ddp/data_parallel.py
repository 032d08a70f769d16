"""``DistributedDataParallel``: torch's DDP module on ferrodist's Reducer and bucketing.

Same constructor, same attributes the ecosystem reads (``module``, ``process_group``,
``reducer``, ``logger``, ``_has_rebuilt_buckets``, ``require_backward_grad_sync``), same
per-iteration protocol: before forward, rebuild buckets once and broadcast buffers from the
authoritative rank; after forward, arm the Reducer (searching the graph for unused parameters
when asked to); backward reduces bucket by bucket through the post-accumulate-grad hooks.
"""

from __future__ import annotations

import warnings
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator, NoReturn, Optional

import torch
import torch.distributed as tdist
from torch.distributed.algorithms.join import Join, Joinable

from ferrodist.ddp import _bucket_assignment as ba
from ferrodist.ddp import comm_hook as ch
from ferrodist.ddp import module_sync
from ferrodist.ddp.delayed import DelayedAllReduce
from ferrodist.ddp.join import DDPJoinSupport
from ferrodist.ddp.logger import Logger
from ferrodist.ddp.mixed_precision import (
    MixedPrecisionCasts,
    _reducer_allreduce_and_upcast_hook,
)
from ferrodist.ddp.mixed_precision import check_config as check_mixed_precision
from ferrodist.ddp.pickling import DDPPickleSupport
from ferrodist.ddp.reducer import Reducer
from ferrodist.ddp.registration import _register_builtin_comm_hook, _register_comm_hook
from ferrodist.ddp.sink import pass_through_sink
from ferrodist.ddp.unused import find_tensors


class DistributedDataParallel(DDPJoinSupport, DDPPickleSupport, torch.nn.Module, Joinable):
    """Data-parallel training of ``module``; a drop-in for ``torch.nn.parallel``'s DDP."""

    def __init__(
        self,
        module: torch.nn.Module,
        device_ids: Optional[list[Any]] = None,
        output_device: Any = None,
        dim: int = 0,
        broadcast_buffers: Optional[bool] = None,
        init_sync: bool = True,
        process_group: Any = None,
        bucket_cap_mb: Optional[float] = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        delay_all_reduce_named_params: Any = None,
        param_to_hook_all_reduce: Any = None,
        mixed_precision: Any = None,
        device_mesh: Any = None,
        skip_all_reduce_unused_params: bool = False,
        bucket_cap_mb_list: Optional[list[int]] = None,
        batched_grad_copy: bool = False,
        forward_sync_buffers: Optional[bool] = None,
    ) -> None:
        super().__init__()
        Joinable.__init__(self)
        if (delay_all_reduce_named_params is None) != (param_to_hook_all_reduce is None):
            raise ValueError(
                "delay_all_reduce_named_params and param_to_hook_all_reduce "
                "need to be set at the same time."
            )
        if mixed_precision is not None:
            check_mixed_precision(mixed_precision)
        if process_group is not None and device_mesh is not None:
            raise RuntimeError("Cannot specify both process_group and device_mesh arguments.")
        if device_mesh is not None:
            if device_mesh.ndim != 1:
                raise RuntimeError(f"Only 1D device mesh is supported, but got {device_mesh}.")
            process_group = device_mesh.get_group(mesh_dim=0)
        self.process_group = process_group or tdist.distributed_c10d._get_default_group()
        self.parameters_to_ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        self._delay_all_reduce_params = []
        for name, param in delay_all_reduce_named_params or ():
            self.parameters_to_ignore.add(name)
            self._delay_all_reduce_params.append(param)
        self._module_parameters = [
            p for n, p in module.named_parameters() if n not in self.parameters_to_ignore
        ]
        trainable = any(p.requires_grad for p in self._module_parameters)
        if not trainable and not self._delay_all_reduce_params:
            raise RuntimeError(
                "DistributedDataParallel is not needed when a module doesn't have any "
                "parameter that requires a gradient."
            )
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single element.")
        devices = {p.device for p in self._module_parameters}
        self.is_multi_device_module = len(devices) > 1
        device_types = {d.type for d in devices}
        if len(device_types) != 1:
            raise ValueError(
                "DistributedDataParallel's input module must be on the same type of devices, "
                f"but input module parameters locate in {device_types}."
            )
        self.device_type = next(iter(device_types))
        if not device_ids or self.device_type == "cpu" or self.is_multi_device_module:
            if device_ids or output_device:
                raise ValueError(
                    "DistributedDataParallel device_ids and output_device arguments only work "
                    "with single-device/multiple-device GPU modules or CPU modules, but got "
                    f"device_ids {device_ids}, output_device {output_device}, and module "
                    f"parameters {devices}."
                )
            self.device_ids = None
            self.output_device = None
        else:
            self.device_ids = [torch.device(self.device_type, d).index for d in device_ids]
            out = output_device if output_device is not None else device_ids[0]
            self.output_device = torch.device(self.device_type, out).index
        self.static_graph = False
        self.dim = dim
        self.module = module
        self.device = next(iter(self._module_parameters)).device
        if broadcast_buffers is not None:
            warnings.warn(
                "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead.",
                FutureWarning,
                stacklevel=2,
            )
        if forward_sync_buffers is not None:
            self.forward_sync_buffers, init_sync_buffers = forward_sync_buffers, True
        else:
            effective = True if broadcast_buffers is None else bool(broadcast_buffers)
            self.forward_sync_buffers = init_sync_buffers = effective
        self.broadcast_buffers = self.forward_sync_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.skip_all_reduce_unused_params = skip_all_reduce_unused_params
        self.batched_grad_copy = batched_grad_copy
        self.mixed_precision = mixed_precision
        self._mixed_precision: Optional[MixedPrecisionCasts] = None
        if check_reduction:
            warnings.warn(
                "The `check_reduction` argument in `DistributedDataParallel` module is "
                "deprecated. Please avoid using it.",
                FutureWarning,
                stacklevel=2,
            )
        self.broadcast_bucket_size = 250 * 1024 * 1024
        default_cap = bucket_cap_mb is None and not bucket_cap_mb_list
        cap_mb = max(bucket_cap_mb_list) if bucket_cap_mb_list else bucket_cap_mb
        cap_mb = ba.DEFAULT_BUCKET_CAP_MB if cap_mb is None else cap_mb
        self.bucket_bytes_cap = int(cap_mb * ba.MB_TO_BYTES)
        self.bucket_bytes_cap_list = [int(c * ba.MB_TO_BYTES) for c in bucket_cap_mb_list or ()]
        self._first_bucket_bytes_cap = (
            tdist._DEFAULT_FIRST_BUCKET_BYTES if default_cap else self.bucket_bytes_cap
        )
        self.bucket_bytes_cap_default = self._first_bucket_bytes_cap < self.bucket_bytes_cap
        self._delayed: Optional[DelayedAllReduce] = None
        self._delay_all_reduce_all_params = False
        if self._delay_all_reduce_params:
            self._delayed = DelayedAllReduce(
                self._delay_all_reduce_params,
                param_to_hook_all_reduce,
                self.process_group,
                None if not self.device_ids else self.device_ids[0],
            )
            self._delay_all_reduce_all_params = not any(
                p.requires_grad
                for n, p in self.module.named_parameters()
                if n not in self.parameters_to_ignore
            )
            if self._delay_all_reduce_all_params:
                return  # no Reducer at all, as in torch
        parameters, names = self._build_params_for_reducer()
        if init_sync:
            module_sync.verify_params_across_ranks(self.process_group, names, parameters)
            states = self._module_states(init_sync_buffers)
            module_sync.broadcast_tensors(self.process_group, states, 0)
        self._ddp_init_helper(parameters, dict(enumerate(names)), static_graph)
        self._comm_hooks: list[tuple[Callable[..., Any], object]] = []
        self._has_rebuilt_buckets = False
        self._static_graph_delay_allreduce_enqueued = False
        self._divide_by_initial_world_size = True
        if mixed_precision is not None:
            self._setup_mixed_precision(mixed_precision)
        if static_graph:
            self._set_static_graph()

    # ---- construction -------------------------------------------------------------------

    def _build_params_for_reducer(self) -> tuple[list[torch.nn.Parameter], list[str]]:
        seen: set[int] = set()
        self._expect_sparse_gradient: list[bool] = []
        params, names = [], []
        for module_name, sub in self.module.named_modules():
            for param_name, p in sub.named_parameters(recurse=False):
                fqn = f"{module_name}.{param_name}" if module_name else param_name
                if not p.requires_grad or fqn in self.parameters_to_ignore or id(p) in seen:
                    continue
                seen.add(id(p))
                params.append(p)
                names.append(fqn)
                sparse = isinstance(sub, (torch.nn.Embedding, torch.nn.EmbeddingBag))
                self._expect_sparse_gradient.append(sparse and bool(sub.sparse))
        self._assign_modules_buffers()
        return params, names

    def _module_states(self, with_buffers: bool) -> list[torch.Tensor]:
        """Parameters (and buffers) that rank-to-rank syncs overwrite, minus ignored names."""
        named: list[tuple[str, torch.Tensor]] = list(self.module.named_parameters())
        if with_buffers:
            named += list(self.module.named_buffers())
        return [t.detach() for n, t in named if n not in self.parameters_to_ignore]

    def _setup_mixed_precision(self, config: Any) -> None:
        named = [
            (n, p) for n, p in self.module.named_parameters() if n not in self.parameters_to_ignore
        ]
        casts = MixedPrecisionCasts(config, named)
        casts.cast_buffers(self.modules_buffers)
        self.module.register_forward_pre_hook(casts.forward_pre_hook, with_kwargs=True)
        self.register_comm_hook((casts, self.process_group), _reducer_allreduce_and_upcast_hook)
        if casts.param_dtype is not None:
            self.reducer._set_mixed_precision_param_dtype(casts.param_dtype)
        self.reducer._set_mixed_precision(casts)
        self._mixed_precision = casts

    def _assign_modules_buffers(self) -> None:
        self.modules_buffers = [
            b for n, b in self.module.named_buffers() if n not in self.parameters_to_ignore
        ]

    def _ddp_init_helper(
        self, parameters: list[torch.nn.Parameter], names: dict[int, str], static_graph: bool
    ) -> None:
        if self.bucket_bytes_cap_list:
            limits = list(self.bucket_bytes_cap_list)
        elif static_graph or not self.find_unused_parameters:
            limits = [ba.NO_LIMIT]
        elif self.bucket_bytes_cap_default:
            limits = [self._first_bucket_bytes_cap, self.bucket_bytes_cap]
        else:
            limits = [self.bucket_bytes_cap]
        sparse = self._expect_sparse_gradient
        indices, per_bucket = ba.assign_buckets(parameters, limits, sparse)
        self.reducer = Reducer(
            parameters,
            list(reversed(indices)),
            list(reversed(per_bucket)),
            self.process_group,
            sparse,
            self.bucket_bytes_cap,
            self.find_unused_parameters,
            self.gradient_as_bucket_view,
            names,
            self._first_bucket_bytes_cap,
            self.skip_all_reduce_unused_params,
            False,
            self.bucket_bytes_cap_list if self.bucket_bytes_cap_list else [],
            self.batched_grad_copy,
        )
        self.logger = Logger(self.reducer)
        self.reducer.set_logger(self.logger)
        has_sync_bn = any(isinstance(m, torch.nn.SyncBatchNorm) for m in self.module.modules())
        self.logger.set_construction_data_and_log(
            type(self.module).__name__,
            self.device_ids or [],
            -1 if self.output_device is None else self.output_device,
            self.forward_sync_buffers,
            has_sync_bn,
            static_graph,
        )

    # ---- forward ----------------------------------------------------------------------------

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self._delay_all_reduce_all_params:
            output = self.module(*inputs, **kwargs)
            self._clear_grad_buffer()
            return output
        inputs, kwargs = self._pre_forward(*inputs, **kwargs)
        output = self._post_forward(self.module(*inputs, **kwargs))
        self._clear_grad_buffer()
        if self._mixed_precision is not None and not torch.is_grad_enabled():
            self._mixed_precision.to_full_precision()  # no backward will put them back
        return output

    def _clear_grad_buffer(self) -> None:
        if self._delayed is not None:
            self._delayed.point_grads_at_buffer()

    def _pre_forward(self, *inputs: Any, **kwargs: Any) -> tuple[Any, Any]:
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self.logger.set_runtime_stats_and_log()
            self.reducer.prepare_for_forward()
        work = Join.notify_join_context(self)
        if work:
            self.reducer._set_forward_pass_work_handle(work, self._divide_by_initial_world_size)
        if torch.is_grad_enabled() and self.reducer._rebuild_buckets():
            self._has_rebuilt_buckets = True
        if self.will_sync_module_buffers():
            self._sync_buffers()
        if self._join_config.enable:
            self._check_global_requires_backward_grad_sync(is_joined_rank=False)
        if self.device_ids:
            target = torch.device(self.device_type, self.device_ids[0])
            inputs, kwargs = _move_to(inputs, target), _move_to(kwargs, target)
        if self._mixed_precision is not None:
            inputs, kwargs = self._mixed_precision.cast_inputs(inputs, kwargs)
        return inputs, kwargs

    def _post_forward(self, output: Any) -> Any:
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self.require_forward_param_sync = True
            if self.find_unused_parameters and not self.static_graph:
                self.reducer.prepare_for_backward(find_tensors(output))
            else:
                self.reducer.prepare_for_backward([])
        else:
            self.require_forward_param_sync = False
        if (self.find_unused_parameters and not self.static_graph) or (
            self.static_graph and not self._static_graph_delay_allreduce_enqueued
        ):
            output = pass_through_sink(weakref.ref(self), output)
        return output

    # ---- buffers ------------------------------------------------------------------------

    def will_sync_module_buffers(self) -> bool:
        """Whether this forward broadcasts the module's buffers first."""
        return (
            self.require_forward_param_sync
            and self.forward_sync_buffers
            and len(self.modules_buffers) > 0
        )

    def _sync_buffers(self) -> None:
        with torch.no_grad():
            src = 0
            if self._join_config.enable:
                src = self._find_common_rank(self._distributed_rank, True)
            self._assign_modules_buffers()
            module_sync.broadcast_tensors(self.process_group, self.modules_buffers, src)

    def _check_and_sync_module_buffers(self) -> None:
        if self.will_sync_module_buffers():
            src = self._find_common_rank(self._distributed_rank, False)
            module_sync.broadcast_tensors(self.process_group, self.modules_buffers, src)

    @property
    def _distributed_rank(self) -> int:
        return int(tdist.get_rank(self.process_group))

    # ---- public controls ------------------------------------------------------------------

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the first backward after the block syncs them all."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def _log_and_throw(self, err_type: type[Exception], err_msg: str) -> NoReturn:
        """Record ``"<class '...'>: message"`` as the logging data's error, as torch's DDP does
        for the errors it raises itself, then raise ``err_type(err_msg)``."""
        logger = getattr(self, "logger", None)
        if logger is not None:
            logger.set_error_and_log(f"{err_type}: {err_msg}")
        raise err_type(err_msg)

    def _check_comm_hook(self, hook: Any) -> None:
        ch.check_comm_hook(hook, self._log_and_throw)

    def register_comm_hook(self, state: object, hook: Callable[..., Any]) -> None:
        """Reduce every bucket with ``hook(state, bucket) -> Future[Tensor]`` (once, up front).

        A hook torch's checks refuse (not callable, a wrong ``bucket`` or return annotation)
        raises their ``TypeError`` or ``ValueError`` and is recorded in the logging data's
        ``has_error`` and ``error``, as torch records it. A hook that returns something other
        than a Future fails only when backward runs it, with torch's ``RuntimeError``, which
        torch does not record there, and neither does ferrodist.
        """
        self._check_comm_hook(hook)
        self.logger._set_comm_hook_name(hook.__qualname__)
        self._comm_hooks.append((hook, state))
        _register_comm_hook(self.reducer, state, hook)

    def _register_builtin_comm_hook(self, comm_hook_type: Any) -> None:
        self.logger._set_comm_hook_name(str(comm_hook_type))
        _register_builtin_comm_hook(self.reducer, comm_hook_type)

    def _register_fused_optim(
        self, optim: type, *args: Any, optim_params: Any = None, **kwargs: Any
    ) -> None:
        from torch.distributed.algorithms._optimizer_overlap import _as_overlapped_optim

        overlapped = _as_overlapped_optim(optim, optim_params, *args, **kwargs)
        try:
            overlapped.register_ddp(self)
        except NotImplementedError as e:
            raise RuntimeError(
                f"{optim} does not support overlapped DDP. Please file an issue to PyTorch "
                "or the respective owner of {optim}."
            ) from e

    def _set_static_graph(self) -> None:
        if self.static_graph:
            warnings.warn(
                "You've set static_graph to be True, no need to set it again.", stacklevel=2
            )
            return
        self.static_graph = True
        self._static_graph_delay_allreduce_enqueued = False
        self.reducer._set_static_graph()
        self.logger._set_static_graph()
        if self.find_unused_parameters:
            warnings.warn(
                "You passed find_unused_parameters=true to DistributedDataParallel, "
                "`_set_static_graph` will detect unused parameters automatically, so you do "
                "not need to set find_unused_parameters=true, just be sure these unused "
                "parameters will not change during training loop while calling "
                "`_set_static_graph`.",
                stacklevel=2,
            )

    def _get_ddp_logging_data(self) -> dict[str, Any]:
        return self.logger._get_ddp_logging_data()

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate: int) -> None:
        if sample_rate < 1:
            self._log_and_throw(
                ValueError, "DDP runtime logging sample rate should be equal or greater than 1"
            )
        self.logger._set_sample_rate(sample_rate)


def _move_to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move_to(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _move_to(v, device) for k, v in obj.items()}
    return obj
