"""DDP communication hooks (mirrors ``torch.distributed.algorithms.ddp_comm_hooks``)."""

from ferrodist.algorithms.ddp_comm_hooks import default_hooks  # noqa: F401
