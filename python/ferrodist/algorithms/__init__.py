"""``ferrodist.algorithms``: mirrors ``torch.distributed.algorithms`` (DDP comm hooks, overlap)."""
