"""ZeroRedundancyOptimizer against torch's, in real processes on gloo.

One spawned world per world size runs the whole parity matrix (SGD with momentum, Adam, AdamW x
bucket view off/on, two parameter groups), ``add_param_group``, a resharding chain (the
checkpoint consolidated at world 4 is loaded at 2, the one from 2 at 3, each continuing
bit-identically to the unsharded optimizer), the DDP overlap hooks against torch's, Join with
uneven inputs, optimizer overlap (``register_ddp``) and ShardedOptimizer over DTensor.
"""

from __future__ import annotations

import gc

import pytest
import torch.multiprocessing as mp
from _zero_workers import OPTIMIZERS, backward, make_model, param_groups, run_world


def _warm_up() -> None:
    """Pay torch's one-off first-step cost (lazy imports) once, before forking the worlds."""
    for cls, kwargs in OPTIMIZERS.values():
        model = make_model()
        opt = cls(param_groups(model), **kwargs)
        backward(model, seed=0)
        opt.step()
    # Earlier tests in this process may leave DDP modules in reference cycles that hold a
    # destroyed group; collected in a forked child, its gloo destructor waits on threads the
    # child does not have, and the world hangs. Collect them here, before forking.
    gc.collect()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_parity_and_resharding_across_world_sizes(tmp_path) -> None:
    _warm_up()
    # Shrink then grow: 4 -> 2 -> 3.
    for world, load_from in [(4, None), (2, 4), (3, 2)]:
        # fork: the children inherit the imported, warmed-up torch (spawn costs ~15 s a world
        # on a loaded machine).
        mp.start_processes(
            run_world,
            args=(world, str(tmp_path), load_from),
            nprocs=world,
            join=True,
            start_method="fork",
        )
