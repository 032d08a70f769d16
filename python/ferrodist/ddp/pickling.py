"""Copying and pickling a DDP model, with torch's rules.

``copy.deepcopy(ddp)`` is common in training scripts (an EMA or a frozen teacher copy of the
wrapped model), and so is pickling one. A process group, a Reducer with its hooks and a
Logger cannot travel; torch therefore allows it only over the default process group, leaves
those three out of the state, and builds a fresh Reducer (and Logger) on the default group
when the state is restored, with the same options. Comm hooks are not registered again.
"""

from __future__ import annotations

import copy
from typing import Any

import torch.distributed as tdist

_NOT_DEFAULT_GROUP = (
    "DDP Pickling/Unpickling are only supported when using DDP with the default process group. "
    "That is, when you have called init_process_group and have not passed process_group "
    "argument to DDP constructor"
)

#: Attributes that belong to this process's communication and are built again on restore.
_LEFT_OUT = ("process_group", "reducer", "logger")


class DDPPickleSupport:
    """``__getstate__`` / ``__setstate__`` of ``DistributedDataParallel``."""

    def __getstate__(self) -> dict[str, Any]:
        self._refuse_unless_default_group()
        state = copy.copy(self.__dict__)
        for name in _LEFT_OUT:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        ddp: Any = self
        ddp.process_group = tdist.distributed_c10d._get_default_group()
        super().__setstate__(state)  # type: ignore[misc]
        ddp.__dict__.setdefault("require_forward_param_sync", True)
        ddp.__dict__.setdefault("require_backward_grad_sync", True)
        # a fresh Reducer: it rebuilds its buckets in arrival order again, as torch's does
        ddp._has_rebuilt_buckets = False
        ddp._static_graph_delay_allreduce_enqueued = False
        parameters, names = ddp._build_params_for_reducer()
        ddp._ddp_init_helper(parameters, dict(enumerate(names)), ddp.static_graph)
        if ddp.static_graph:
            ddp.reducer._set_static_graph()
            ddp.logger._set_static_graph()

    def _refuse_unless_default_group(self) -> None:
        ddp: Any = self
        try:
            default = ddp.process_group == tdist.distributed_c10d._get_default_group()
        except RuntimeError:  # no default group any more
            default = False
        if not default:
            ddp._log_and_throw(RuntimeError, _NOT_DEFAULT_GROUP)
