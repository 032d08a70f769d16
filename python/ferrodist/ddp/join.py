"""Uneven inputs: what a rank that ran out of data does while the others still train.

Inside ``torch.distributed.algorithms.join.Join`` a finished ("joined") rank keeps answering
every collective the training ranks issue in an iteration: the bucket rebuild, the buffer
broadcast, the "should we sync" vote, one all-reduce per bucket (with zeros) and the
unused-parameter map. When all ranks have joined, the model is re-synced from the last joiner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as tdist
from torch.distributed.algorithms.join import Join, JoinHook

from ferrodist._recorded_ops import collective
from ferrodist.ddp import module_sync

if TYPE_CHECKING:
    from ferrodist.ddp.data_parallel import DistributedDataParallel

_all_reduce = collective("ddp.join.all_reduce", tdist.all_reduce, "tensor", "op")


class DDPJoinHook(JoinHook):
    """Join hook shadowing one DDP iteration's collectives on a joined rank."""

    def __init__(self, ddp: DistributedDataParallel, divide_by_initial_world_size: bool) -> None:
        ddp.logger._set_uneven_input_join()
        self.ddp = ddp
        self.ddp._divide_by_initial_world_size = divide_by_initial_world_size
        super().__init__()

    def main_hook(self) -> None:
        """Match one training iteration's collectives."""
        ddp = self.ddp
        ddp.reducer._rebuild_buckets()
        ddp._check_and_sync_module_buffers()
        should_sync = ddp._check_global_requires_backward_grad_sync(is_joined_rank=True)
        ddp.require_forward_param_sync = bool(should_sync)
        if not should_sync:
            return
        ddp._match_all_reduce_for_bwd_pass()
        if ddp.find_unused_parameters:
            ddp._match_unused_params_allreduce()
        ddp.reducer._push_all_rebuilt_params()

    def post_hook(self, is_last_joiner: bool) -> None:
        """Give every rank the final model of the last rank to join."""
        self.ddp._sync_final_model(is_last_joiner)


class DDPJoinSupport:
    """Join entry points of torch's DDP (``join``, ``join_hook``, the matching collectives);
    mixed into :class:`DistributedDataParallel`."""

    device: torch.device
    process_group: Any
    reducer: Any
    require_backward_grad_sync: bool
    forward_sync_buffers: bool
    _authoritative_rank: int

    if TYPE_CHECKING:

        @property
        def _distributed_rank(self) -> int: ...

        def _module_states(self, with_buffers: bool) -> list[torch.Tensor]: ...

    def join(
        self,
        divide_by_initial_world_size: bool = True,
        enable: bool = True,
        throw_on_early_termination: bool = False,
    ) -> Join:
        """Context manager for training with uneven inputs across ranks."""
        return Join(
            [self],  # type: ignore[list-item]
            enable,
            throw_on_early_termination,
            divide_by_initial_world_size=divide_by_initial_world_size,
        )

    def join_hook(self, **kwargs: Any) -> JoinHook:
        """The hook that shadows this DDP's collectives on a joined rank."""
        return DDPJoinHook(self, kwargs.get("divide_by_initial_world_size", True))  # type: ignore[arg-type]

    @property
    def join_device(self) -> torch.device:
        return self.device

    @property
    def join_process_group(self) -> Any:
        return self.process_group

    def _check_global_requires_backward_grad_sync(self, is_joined_rank: bool) -> Optional[bool]:
        wants = not is_joined_rank and self.require_backward_grad_sync
        flag = torch.ones(1, device=self.device) if wants else torch.zeros(1, device=self.device)
        work = _all_reduce(flag, group=self.process_group, async_op=True)
        if not is_joined_rank:
            return None
        assert work is not None
        work.wait()
        return bool(flag.item() != 0)

    def _match_all_reduce_for_bwd_pass(self) -> None:
        futures = [
            self.reducer._run_comm_hook(b) for b in self.reducer._get_zeros_like_grad_buckets()
        ]
        for fut in futures:
            fut.wait()

    def _match_unused_params_allreduce(self) -> None:
        used = self.reducer._get_local_used_map().to(self.device, copy=True)
        _all_reduce(used, group=self.process_group)

    def _sync_final_model(self, is_last_joiner: bool) -> None:
        self._authoritative_rank = self._find_common_rank(self._distributed_rank, is_last_joiner)
        states = self._module_states(self.forward_sync_buffers)
        module_sync.broadcast_tensors(self.process_group, states, self._authoritative_rank)

    def _find_common_rank(self, input_rank: int, rank_cond: bool) -> int:
        """The largest ``input_rank`` among the ranks passing ``rank_cond=True``."""
        value = torch.tensor([input_rank if rank_cond else -1], device=self.device)
        _all_reduce(value, op=tdist.ReduceOp.MAX, group=self.process_group)
        if int(value.item()) == -1:
            raise ValueError(
                "BUG! Expected rank_cond to be true for at least one process. This indicates "
                "a bug in PyTorch, please report an issue."
            )
        return int(value.item())
