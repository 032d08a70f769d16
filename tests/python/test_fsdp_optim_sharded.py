"""SHARDED and LOCAL optimizer state dicts of ferrodist's FSDP against torch's, on gloo.

In spawned worlds of 4, 2 and 3 processes (see ``_fsdp_optim_sharded_workers``): torch's and
ferrodist's ``optim_state_dict`` under SHARDED and LOCAL give the same ShardedTensors, keys and
scalars; ``optim_state_dict_to_load`` takes either one's dict and gives what the optimizer holds;
the deprecated ``sharded_optim_state_dict``/``flatten_sharded_optim_state_dict`` match torch's.
A model+optimizer checkpoint written with ``torch.distributed.checkpoint`` at world 4 by either
FSDP loads into either at worlds 4, 2 and 3, and training continues bitwise alike. LOCAL model
state dicts with ``use_orig_params=True`` match torch's.
"""

from __future__ import annotations

import pytest
import torch.multiprocessing as mp
from _fsdp_optim_sharded_workers import run_world


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_sharded_optim_state_and_checkpoint_round_trip(tmp_path) -> None:
    # World 4 saves (and checks the dicts there); 2 and 3 load its checkpoints.
    for world in (4, 2, 3):
        mp.start_processes(
            run_world, args=(world, str(tmp_path)), nprocs=world, join=True, start_method="spawn"
        )
