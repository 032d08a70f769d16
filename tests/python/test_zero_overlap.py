"""``ZeroRedundancyOptimizer.overlap_with_forward``: the post-step broadcasts left in flight and
waited for per module by the next forward, in real gloo worlds of 2 and 3 processes.

Against torch's (synchronous) ZeRO, bit for bit: SGD with momentum, Adam and AdamW, bucket view
off and on, two parameter groups, ferrodist's DDP; every way the overlap's contract lets a
parameter be read after ``step()``; and that the overlap is real (when the first layer's forward
begins, the last layer's broadcasts have not been waited for); misuse is refused.
"""

from __future__ import annotations

import gc

import pytest
import torch.multiprocessing as mp
from _zero_overlap_workers import run_world
from _zero_workers import OPTIMIZERS, backward, make_model, param_groups


def _warm_up() -> None:
    """Pay torch's one-off first-step cost once, before forking (as test_zero does)."""
    for cls, kwargs in OPTIMIZERS.values():
        model = make_model()
        opt = cls(param_groups(model), **kwargs)
        backward(model, seed=0)
        opt.step()
    gc.collect()  # no DDP cycle holding a destroyed group may be collected in a forked child


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
def test_overlap_with_forward_parity_and_access_paths(tmp_path, world: int) -> None:
    _warm_up()
    mp.start_processes(
        run_world, args=(world, str(tmp_path)), nprocs=world, join=True, start_method="fork"
    )
