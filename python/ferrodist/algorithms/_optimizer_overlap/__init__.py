"""Optimizer overlap: step the optimizer inside DDP's communication hook."""
