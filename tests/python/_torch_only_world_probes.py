"""Functions for test_torch_only_world: a rank that dies by a signal on the first attempt only,
and one that raises. Each run appends a line to the file named by ``PROBE_LOG``."""

from __future__ import annotations

import os
import signal

import torch.distributed as dist


def _attempt() -> int:
    """This rank's attempt number (1-based), logged."""
    path = os.environ["PROBE_LOG"]
    rank = dist.get_rank()
    with open(path, "a") as f:
        f.write(f"{rank}\n")
    with open(path) as f:
        return sum(1 for line in f if line.strip() == str(rank))


def dies_on_first_attempt() -> int:
    attempt = _attempt()
    if attempt == 1 and dist.get_rank() == 0:
        os.kill(os.getpid(), signal.SIGSEGV)
    return attempt


def always_raises() -> int:
    _attempt()
    raise ValueError("a Python error in the probe")
