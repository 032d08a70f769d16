"""Training algorithms built on ferrodist's DDP (mirrors ``torch.distributed.algorithms``)."""

from ferrodist.algorithms import ddp_comm_hooks

__all__ = ["ddp_comm_hooks"]
