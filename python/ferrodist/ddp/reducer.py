"""``Reducer``: averages gradients across ranks bucket by bucket, while backward still runs.

Each parameter gets a post-accumulate-grad hook, native (``_native.GradientHook``): it reports
the gradient to the iteration's plan in Rust (``_native.DdpIteration``) and runs no Python unless
the plan says there is work. The plan owns every decision of an iteration (static graph or not,
unused parameters, the one-time rebuild, what to copy and launch); this class does the tensor
work it asks for. A large gradient is copied into its bucket slot the moment it arrives
(divided by the world size unless a comm hook is registered, which then averages itself), the
small ones together when their bucket is complete; when a bucket's last gradient is in, and
every earlier bucket has been launched, the bucket's all-reduce (or comm hook) starts. Later
layers' buckets therefore travel while autograd is still computing earlier layers. At the end
of backward (an autograd-engine callback) the Reducer waits for every bucket and writes the
averaged values back into ``param.grad``.

After the first iteration the buckets are rebuilt once in the order gradients actually arrived
(rank 0's order wins), so bucket 0 really is the first to fill. With ``find_unused_parameters``
the parameters the forward pass did not reach are marked ready up front, and a per-parameter
"used" count is summed across ranks so a parameter unused everywhere keeps its ``.grad``
untouched. With a static graph the first iteration only records which hooks fire, and reduces
everything in one go at its end. Semantics follow torch's C++ ``Reducer`` (see
``shared/design/torch-semantics.md`` sections 2.4 and 5).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as tdist

from ferrodist import _native, ops
from ferrodist._recorded_ops import collective
from ferrodist.ddp import _bucket_assignment, comm_hook
from ferrodist.ddp.bucket import SMALL_NUMEL, Bucket
from ferrodist.ddp.bucket_sync import broadcast_bucket_layout
from ferrodist.ddp.grad_bucket import GradBucket
from ferrodist.ddp.reducer_join import ReducerJoinSupport
from ferrodist.ddp.reducer_state import RuntimeTimes, unfinished_reduction_message
from ferrodist.ddp.unused import reachable_parameters
from ferrodist.debug import _recorder as _flight

_all_reduce = collective("ddp.all_reduce", tdist.all_reduce, "tensor", "op")
_SUM = tdist.ReduceOp.SUM


def _engine_callback(fn: Callable[[], None]) -> None:
    """Run ``fn`` once the current backward pass has finished."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)  # type: ignore[attr-defined]


class Reducer(ReducerJoinSupport):
    """Gradient bucketing and all-reduce for DDP; torch's ``dist.Reducer`` signature."""

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        bucket_indices: Sequence[Sequence[int]],
        per_bucket_size_limits: Sequence[int],
        process_group: Any,
        expect_sparse_gradients: Sequence[bool] = (),
        bucket_bytes_cap: int = 26214400,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = False,
        param_to_name_mapping: Optional[Mapping[int, str]] = None,
        first_bucket_bytes_cap: int = _bucket_assignment.DEFAULT_FIRST_BUCKET_BYTES,
        skip_all_reduce_unused_params: bool = False,
        use_python_reducer: bool = False,
        bucket_bytes_cap_list: Sequence[int] = (),
        batched_grad_copy: bool = False,
    ) -> None:
        if len(per_bucket_size_limits) != len(bucket_indices):
            raise ValueError("per_bucket_size_limits must have one entry per bucket.")
        self._params = list(params)
        self._expect_sparse = [bool(x) for x in expect_sparse_gradients] or [False] * len(
            self._params
        )
        if len(self._expect_sparse) != len(self._params):
            raise ValueError("expect_sparse_gradients must have one entry per parameter.")
        self._process_group = process_group
        self._all_reduce_options = tdist.AllreduceOptions()  # a sum, torch's C++ Reducer's
        self._bucket_bytes_cap = int(bucket_bytes_cap)
        self._first_bucket_bytes_cap = int(first_bucket_bytes_cap)
        self._bucket_bytes_cap_list = [int(x) for x in bucket_bytes_cap_list]
        self._find_unused = bool(find_unused_parameters)
        self._as_bucket_view = bool(gradient_as_bucket_view)
        self._names = dict(param_to_name_mapping or {})
        self._comm_hook: Optional[Callable[[GradBucket], Any]] = None
        self._comm_hook_kind = ""
        self._global_used: Optional[torch.Tensor] = None
        self._used_work: Any = None
        self._div_factor: Optional[int] = None
        self._forward_work: Any = None
        self._static_world_size = True
        self.times = RuntimeTimes()
        self.logger: Any = None
        self._bucket_dtype: Optional[torch.dtype] = None
        self._mixed_precision: Any = None
        #: parameter index -> (bucket, position) of the gradients ``Bucket.take_early`` copies
        #: as they arrive (when the plan says so)
        self._large_slots: dict[int, tuple[Bucket, int]] = {}
        self._plan = _native.DdpIteration(
            [list(b) for b in bucket_indices],
            [
                p.numel() >= SMALL_NUMEL and not sparse
                for p, sparse in zip(self._params, self._expect_sparse)
            ],
            find_unused=self._find_unused,
            skip_unused=bool(skip_all_reduce_unused_params),
        )
        self._initialize_buckets(bucket_indices, per_bucket_size_limits)
        self._hook_handles = [
            p.register_post_accumulate_grad_hook(self._make_hook(i))
            for i, p in enumerate(self._params)
        ]

    # ---- buckets ----------------------------------------------------------------------------

    def _initialize_buckets(
        self,
        bucket_indices: Sequence[Sequence[int]],
        limits: Sequence[int],
        rebuilt: bool = False,
    ) -> None:
        layout = [list(b) for b in bucket_indices]
        if rebuilt:
            self._plan.rebuilt(layout)
        else:
            self._plan.set_buckets(layout)
        self._buckets = [
            Bucket.build(
                self._params,
                list(idx),
                int(lim),
                any(self._expect_sparse[i] for i in idx),
                self._bucket_dtype,
            )
            for idx, lim in zip(bucket_indices, limits)
        ]
        if self._as_bucket_view:
            for bucket in self._buckets:
                for p, view in zip(bucket.parameters, bucket.views_in):
                    if p.grad is not None:
                        view.copy_(p.grad)
                        p.grad = view
        self._large_slots = {
            bucket.variable_indices[pos]: (bucket, pos)
            for bucket in self._buckets
            if not bucket.sparse
            for pos in bucket.large
        }
        self._reset_bucket_counting()

    def _reset_bucket_counting(self) -> None:
        self._plan.reset()
        for bucket in self._buckets:
            bucket.future = None
            bucket.early.clear()

    def _bucket_limits_for_rebuild(self) -> list[int]:
        if self._bucket_bytes_cap_list:
            return list(self._bucket_bytes_cap_list)
        return [self._first_bucket_bytes_cap, self._bucket_bytes_cap]

    def _rebuild_buckets(self) -> bool:
        """Rebuild once, in gradient-arrival order agreed from rank 0; True if it happened."""
        self._ensure_prior_reduction_finished()
        order = self._plan.rebuild_order()
        if order is None:
            return False
        if len(order) != len(self._params):
            raise RuntimeError(
                "rebuilt parameter indices size is not same as original model parameters size."
                f"Original model param size is: {len(self._params)} versus rebuilt params size "
                f"of: {len(order)}"
            )
        indices, limits = _bucket_assignment.assign_buckets(
            [self._params[i] for i in order],
            self._bucket_limits_for_rebuild(),
            self._expect_sparse,  # indexed by parameter index, as torch's
            order,
        )
        indices, limits = broadcast_bucket_layout(
            self._process_group, indices, limits, self._params[0].device
        )
        self._initialize_buckets(indices, limits, rebuilt=True)
        return True

    # ---- iteration ----------------------------------------------------------------------------

    def prepare_for_forward(self) -> None:
        """Count the iteration and stamp the forward start."""
        self._plan.begin_forward()
        self.times.forward_start = time.time_ns()

    def prepare_for_backward(
        self, outputs: Union[torch.Tensor, Sequence[torch.Tensor]] = ()
    ) -> None:
        """Arm the hooks for the next backward; find unused parameters from ``outputs``.

        Args:
            outputs: the forward outputs (one tensor or a list), searched for the parameters
                they do not depend on when ``find_unused_parameters`` is on.
        """
        if isinstance(outputs, torch.Tensor):
            outputs = [outputs]
        self._ensure_prior_reduction_finished()
        self.times.backward_compute_start = time.time_ns()
        self.times.comm_start = 0
        unused: list[int] = []
        if self._plan.searches_unused():
            used = reachable_parameters(outputs)
            unused = [i for i, p in enumerate(self._params) if id(p) not in used]
        self._plan.begin_backward(unused)
        for bucket in self._buckets:
            bucket.future = None
            bucket.early.clear()

    def _ensure_prior_reduction_finished(self) -> None:
        missing = self._plan.unfinished()
        if missing is not None:
            raise RuntimeError(
                unfinished_reduction_message(
                    self._plan.static_graph, self._find_unused, self._rank(), missing, self._names
                )
            )

    def _rank(self) -> int:
        return int(tdist.get_rank(self._process_group))

    def _make_hook(self, index: int) -> _native.GradientHook:
        # Runs per gradient, in Rust: reports to the plan and calls back only to launch
        # buckets, or, for a gradient the plan copies as it arrives, to copy it
        # (``_take_early``); most gradients of a real model run no Python at all. It holds this
        # Reducer weakly (a hook on our own parameter would otherwise keep us alive).
        return _native.GradientHook(
            self._plan,
            index,
            self,
            launch=Reducer._launch,
            ready_twice=Reducer._ready_twice,
            copy=Reducer._take_early,
        )

    def _take_early(self, index: int, param: torch.Tensor) -> None:
        bucket, pos = self._large_slots[index]
        bucket.take_early(pos, param, self._divisor(), self._as_bucket_view)

    def _divisor(self) -> Optional[int]:
        """What a gradient is divided by on its way into its bucket (None with a comm hook)."""
        self._set_divide_factor()
        return None if self._comm_hook is not None else (self._div_factor or 1)

    def _ready_twice(self, index: int) -> RuntimeError:
        name = self._names.get(index, str(index))
        return RuntimeError(
            f"Expected to mark a variable ready only once. Parameter {name} (index {index}) "
            "was marked ready twice in one iteration; if the model reuses a module or "
            "runs backward twice, consider static_graph=True."
        )

    def _set_divide_factor(self) -> None:
        if self._div_factor is not None:
            return
        self._div_factor = int(self._process_group.size())
        if self._forward_work is not None and not self._static_world_size:
            self._forward_work.wait()
            self._div_factor = int(self._forward_work.result()[0].item())

    def _launch(self, first: int, end: int, finish: bool, reduce_used_map: bool) -> None:
        """Fill and reduce buckets ``first..end`` (those the plan does not leave out); after
        the last, finalize at backward's end."""
        divide_by = self._divisor()
        with torch.no_grad():
            for b in range(first, end):
                self._buckets[b].fill(divide_by, self._as_bucket_view)
                if not self._plan.skips(b):
                    self._all_reduce_bucket(b)
        if reduce_used_map:
            self._all_reduce_local_used_map()
        if finish:
            _engine_callback(self._end_of_backward)

    def _all_reduce_bucket(self, b: int) -> None:
        if self.times.comm_start == 0:
            self.times.comm_start = time.time_ns()
        bucket = self._buckets[b]
        if self._comm_hook is None:  # no GradBucket to build: the all-reduce takes the buffer
            bucket.future = self._default_all_reduce(bucket.buffer)
            return
        bucket.future = self._run_comm_hook(
            bucket.grad_bucket(b, len(self._buckets), bucket.buffer)
        )

    def _run_comm_hook(self, grad_bucket: GradBucket) -> Any:
        """Run the registered hook (or the default sum all-reduce) on one bucket."""
        if self._comm_hook is None:
            return self._default_all_reduce(grad_bucket.buffer())
        return comm_hook.checked_future(self._comm_hook(grad_bucket))

    def _default_all_reduce(self, buffer: torch.Tensor) -> Any:
        """Sum ``buffer`` across ranks: the work's own future (its value: ``[buffer]``), with
        no Python callback on the backend's thread.

        Started on the process group itself, as torch's C++ Reducer does: ``dist.all_reduce``
        adds ~50 us of Python per bucket for cases a bucket never is (a rank outside the
        group, a coalescing block, a tensor subclass). A complex bucket still goes through it,
        for its view as real numbers.
        """
        group = self._process_group
        # A sparse gradient goes through ferrodist's all_reduce, whose sum on gloo is its own
        # (ferrodist._sparse_all_reduce: gloo's corrupts the heap) and made in its launch.
        sparse = buffer.is_sparse
        # Recorded once launched, while the backend runs it; on a device first, as its launch
        # may block (see ferrodist._recorded_ops), and so is the sparse sum, made in its launch.
        launch_first = buffer.is_cpu and not sparse
        ident = None if launch_first else self._record_bucket(buffer)
        try:
            if sparse:
                work = ops._all_reduce(buffer, _SUM, group, async_op=True)
                assert work is not None
            elif buffer.is_complex():
                work = tdist.all_reduce(buffer, group=group, async_op=True)
                assert work is not None
            else:
                work = group.allreduce([buffer], self._all_reduce_options)
        except BaseException as e:
            _flight.fail(self._record_bucket(buffer) if launch_first else ident, e)
            raise
        if launch_first:
            ident = self._record_bucket(buffer)
        _flight.hold_until_finished(ident, work)
        return work.get_future()

    def _record_bucket(self, buffer: torch.Tensor) -> Optional[int]:
        """Record a bucket's all-reduce, issued and started; its id (None when recording is
        off)."""
        group = self._process_group
        return _flight.begin(
            "ddp.all_reduce",
            _flight.describe_group(group),
            (buffer,),
            "SUM",
            started=True,
            internal=True,
        )

    @property
    def _local_used(self) -> torch.Tensor:
        """torch's local used map: int32, 1 where the parameter's hook fired."""
        data = bytearray(self._plan.used_bytes())
        if not data:
            return torch.zeros(0, dtype=torch.int32)
        return torch.frombuffer(data, dtype=torch.int32)

    @property
    def _grad_ready_order(self) -> list[int]:
        """Parameters in the order their gradients arrived in the last backward."""
        return list(self._plan.arrival_order())

    def _all_reduce_local_used_map(self) -> None:
        # on the parameters' device: NCCL reduces only device tensors
        self._global_used = self._local_used.to(self._params[0].device, copy=True)
        self._used_work = _all_reduce(self._global_used, group=self._process_group, async_op=True)

    def _end_of_backward(self) -> None:
        self.times.backward_compute_end = time.time_ns()
        self._plan.end_of_backward()
        self._finalize_backward()

    def _delay_all_reduce(self) -> None:
        """Static graph, first iteration: reduce every bucket once backward has finished."""
        self.times.backward_compute_end = time.time_ns()
        self._all_reduce_local_used_map()
        run = self._plan.reduce_all_at_end()
        divide_by = self._divisor()
        with torch.no_grad():
            for b in range(len(self._buckets)):
                self._buckets[b].fill(divide_by, self._as_bucket_view)
            if run is not None:
                for b in range(run[0], run[1]):
                    self._all_reduce_bucket(b)
        self._finalize_backward()

    def _finalize_backward(self) -> None:
        unused = self._globally_unused()
        self._plan.finish_backward()
        if self._mixed_precision is not None:
            self._mixed_precision.to_full_precision()
        with torch.no_grad():
            # The .grad copies of finished buckets are gathered and done in one call, just
            # before waiting on a bucket still in flight (so they overlap its reduction) and
            # at the end: one call instead of one per bucket, the same copies.
            copies: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
            for bucket in self._buckets:
                future = bucket.future
                if future is None:  # left out as unused (skip_all_reduce_unused_params)
                    continue
                if copies[0] and not future.done():
                    torch._foreach_copy_(*copies)
                    copies = ([], [])
                result = comm_hook.hook_result_tensor(future.wait())
                bucket.write_back(result, self._as_bucket_view, unused, copies)
            if copies[0]:
                torch._foreach_copy_(*copies)
        if self._used_work is not None:
            self._used_work.wait()
            self._used_work = None
        self._div_factor = None
        self._forward_work = None
        self.times.comm_end = time.time_ns()

    def _globally_unused(self) -> frozenset[int]:
        """Parameters no rank used this iteration (only tracked with find_unused/static)."""
        if not self._plan.may_have_unused():
            return frozenset()
        if self._used_work is not None:
            self._used_work.wait()
            self._used_work = None
        if self._global_used is None:
            return frozenset()
        return frozenset(i for i, n in enumerate(self._global_used.tolist()) if n == 0)

    # ---- hooks, static graph, logging -------------------------------------------------

    def _set_comm_hook(self, hook: Callable[[GradBucket], Any], kind: str) -> None:
        if self._comm_hook is not None:
            first, second = (
                ("register_builtin_comm_hook", "register_comm_hook")
                if kind == "builtin"
                else ("register_comm_hook", "register_builtin_comm_hook")
            )
            message = f"{first} or {second} can only be called once."
            if self.logger is not None:
                self.logger.set_error_and_log(message)
            raise RuntimeError(message)
        self._comm_hook = hook
        self._comm_hook_kind = kind

    def _set_mixed_precision_param_dtype(self, dtype: torch.dtype) -> None:
        """Hold gradients in ``dtype`` (mixed precision's compute dtype); rebuilds the buckets."""
        self._bucket_dtype = dtype
        self._initialize_buckets(
            [b.variable_indices for b in self._buckets], [b.size_limit for b in self._buckets]
        )

    def _set_mixed_precision(self, casts: Any) -> None:
        """Put parameters back to full precision (``casts``) before results reach ``.grad``."""
        self._mixed_precision = casts

    def _set_static_graph(self) -> None:
        """Declare the graph static; must come before the first iteration."""
        if not self._plan.set_static_graph():
            raise RuntimeError(
                "set_static_graph() should be called before training loop starts "
                "and after DistributedDataParallel is constructed."
            )

    def _ddp_graph_static(self) -> bool:
        """Whether every iteration so far used the same parameters (torch's heuristic)."""
        return bool(self._plan.graph_static())

    def _check_reducer_finalized(self) -> None:
        self._ensure_prior_reduction_finished()

    def _remove_autograd_hooks(self) -> None:
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []

    def _reset_state(self) -> None:
        self._reset_bucket_counting()

    def set_logger(self, logger: Any) -> None:
        """Attach the ``Logger`` that reads this Reducer's bookkeeping."""
        self.logger = logger

    def get_backward_stats(self) -> list[int]:
        """Per-parameter position in the last gradient-arrival order (-1: none)."""
        stats = [-1] * len(self._params)
        for pos, index in enumerate(self._grad_ready_order):
            stats[index] = pos
        return stats

    def __del__(self) -> None:
        for handle in getattr(self, "_hook_handles", []):
            handle.remove()
