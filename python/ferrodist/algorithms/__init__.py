"""Training algorithms built on ferrodist's DDP (mirrors ``torch.distributed.algorithms``)."""
