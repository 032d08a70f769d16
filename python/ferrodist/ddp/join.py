"""Uneven inputs: what a rank that ran out of data does while the others still train.

Inside ``torch.distributed.algorithms.join.Join`` a finished ("joined") rank keeps answering
every collective the training ranks issue in an iteration: the bucket rebuild, the buffer
broadcast, the "should we sync" vote, one all-reduce per bucket (with zeros) and the
unused-parameter map. When all ranks have joined, the model is re-synced from the last joiner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.distributed.algorithms.join import JoinHook

if TYPE_CHECKING:
    from ferrodist.ddp.data_parallel import DistributedDataParallel


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


def find_common_rank(ddp: Any, rank: int, candidate: bool) -> int:
    """The largest ``rank`` among the ranks passing ``candidate=True``."""
    import torch
    import torch.distributed as tdist

    value = torch.tensor([rank if candidate else -1], device=ddp.device)
    tdist.all_reduce(value, op=tdist.ReduceOp.MAX, group=ddp.process_group)
    if int(value.item()) == -1:
        raise ValueError(
            "BUG! Expected rank_cond to be true for at least one process. This indicates a "
            "bug in PyTorch, please report an issue."
        )
    return int(value.item())
