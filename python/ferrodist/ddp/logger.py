"""``Logger``: the DDP logging data torch users read through ``_get_ddp_logging_data()``.

Construction data (model, bucket caps, flags, backend) is set once; runtime figures (forward,
backward compute, backward communication and the compute/communication overlap, in ns) are
sampled like torch's: the first ten iterations, then every ``sample_rate``-th, averaged.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch
import torch.distributed as tdist

from ferrodist.ddp.reducer import Reducer

_SAMPLE_RATE = 100
_FIRST_SAMPLED_ITERATIONS = 10


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half"}.get(
        dtype, str(dtype).replace("torch.", "")
    )


def _gloo_threads(process_group: Any) -> int:
    """Worker threads of the group's gloo backend (torch logs it; gloo's default is 2)."""
    try:
        backend = process_group._get_backend(torch.device("cpu"))
        return int(backend.options._threads)
    except (AttributeError, RuntimeError, TypeError):
        return 2


class Logger:
    """DDP logging data for one ``Reducer``; torch's ``dist.Logger`` methods."""

    def __init__(self, reducer: Reducer) -> None:
        self._reducer = reducer
        self._data: dict[str, Any] = {}
        self._sums = {"forward": 0, "backward_compute": 0, "backward_comm": 0, "overlap": 0}
        self._samples = 0
        self._recorded = 0
        self._sample_rate = _SAMPLE_RATE

    def set_construction_data_and_log(
        self,
        module_name: str,
        device_ids: Sequence[int],
        output_device: int,
        broadcast_buffers: bool,
        has_sync_bn: bool,
        static_graph: bool,
    ) -> None:
        """Record what DDP was built with."""
        r = self._reducer
        pg = r._process_group
        params = r._params
        env = os.environ
        self._data.update(
            module_name=module_name,
            device_ids=", ".join(map(str, device_ids)),
            output_device=int(output_device),
            broadcast_buffers=int(broadcast_buffers),
            has_sync_bn=int(has_sync_bn),
            world_size=int(pg.size()),
            rank=int(tdist.get_rank(pg)),
            backend_name=str(tdist.get_backend(pg)),
            bucket_cap_bytes=r._bucket_bytes_cap,
            find_unused_parameters=int(r._find_unused),
            gradient_as_bucket_view=int(r._as_bucket_view),
            is_multi_device_module=int(len({p.device for p in params}) > 1),
            num_parameter_tensors=len(params),
            total_parameter_size_bytes=sum(p.numel() * p.element_size() for p in params),
            dtypes=", ".join(sorted({_dtype_name(p.dtype) for p in params})),
            bucket_sizes=self._bucket_sizes(),
            master_addr=env.get("MASTER_ADDR", "N/A"),
            master_port=env.get("MASTER_PORT", "N/A"),
            torch_distributed_debug=env.get("TORCH_DISTRIBUTED_DEBUG", "N/A"),
            cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES", "N/A"),
            iteration=0,
        )
        if static_graph:
            self._data["static_graph"] = 1
        if self._data["backend_name"] == "gloo":
            self._data.update(
                gloo_socket_ifname=env.get("GLOO_SOCKET_IFNAME", "N/A"),
                gloo_device_transport=env.get("GLOO_DEVICE_TRANSPORT", "N/A"),
                gloo_num_threads=_gloo_threads(pg),
            )

    def _bucket_sizes(self) -> str:
        return ", ".join(str(b.nbytes) for b in self._reducer._buckets)

    def set_runtime_stats_and_log(self) -> None:
        """Record the previous iteration's figures, on sampled iterations only (as torch):
        the first ten after the first, then every ``sample_rate``-th."""
        r = self._reducer
        plan = r._plan
        it = plan.iterations
        sampled = self._recorded < _FIRST_SAMPLED_ITERATIONS or it % self._sample_rate == 0
        if it == 0 or not sampled:
            return
        self._recorded += 1
        self._data["iteration"] = it
        self._data["num_buckets_reduced"] = plan.buckets_reduced
        order = r._grad_ready_order
        if order:
            self._data["prev_iteration_grad_ready_order_indices"] = ", ".join(map(str, order))
        self._data["unused_parameter_size"] = sum(
            r._params[i].numel() * r._params[i].element_size() for i in plan.unused
        )
        if self._data.get("has_rebuilt_buckets") != int(plan.has_rebuilt):
            self._data["has_rebuilt_buckets"] = int(plan.has_rebuilt)
            if plan.has_rebuilt:
                self._data["rebuilt_bucket_sizes"] = self._bucket_sizes()
                self._data["rebuilt_per_bucket_param_indices"] = ", ".join(
                    " ".join(map(str, b.variable_indices)) for b in r._buckets
                )
        t = r.times
        if t.comm_end == 0 or t.comm_start == 0:
            return
        self._data.update(
            forward_compute_time_start=t.forward_start,
            backward_compute_time_start=t.backward_compute_start,
            backward_compute_time_end=t.backward_compute_end,
            backward_comm_time_start=t.comm_start,
            backward_comm_time_end=t.comm_end,
        )
        figures = {
            "forward": t.backward_compute_start - t.forward_start,
            "backward_compute": t.backward_compute_end - t.backward_compute_start,
            "backward_comm": t.comm_end - t.comm_start,
            "overlap": max(0, t.backward_compute_end - t.comm_start),
        }
        self._samples += 1
        for key, value in figures.items():
            self._sums[key] += value
        names = {
            "forward": "forward_compute_time",
            "backward_compute": "backward_compute_time",
            "backward_comm": "backward_comm_time",
            "overlap": "backward_compute_comm_overlap_time",
        }
        for key, name in names.items():
            self._data[name] = figures[key]
            self._data[f"avg_{name}"] = self._sums[key] // self._samples

    def set_error_and_log(self, error: str) -> None:
        """Remember the error DDP is about to raise."""
        self._data["has_error"] = 1
        self._data["error"] = error

    def _get_ddp_logging_data(self) -> dict[str, Any]:
        return dict(self._data)

    def _set_comm_hook_name(self, name: str) -> None:
        self._data["comm_hook"] = name

    def _set_static_graph(self) -> None:
        self._data["static_graph"] = 1

    def _set_uneven_input_join(self) -> None:
        self._data["join_uneven_inputs"] = 1

    def _set_sample_rate(self, rate: int) -> None:
        if rate < 1:
            raise ValueError("DDP runtime logging sample rate should be equal or greater than 1")
        self._sample_rate = rate
