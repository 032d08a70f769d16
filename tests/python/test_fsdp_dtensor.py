"""SHARDED state dicts as DTensors when ferrodist's FSDP has a device mesh, against torch's.

In spawned gloo worlds of 4 then 2 processes (see ``_fsdp_dtensor_workers``), with CPU device
meshes: 1-D for FULL_SHARD and SHARD_GRAD_OP, 2-D (replicate, shard) for HYBRID_SHARD and
_HYBRID_SHARD_ZERO2. Model and optimizer state dicts hold the DTensors torch's FSDP gives
(placements, shapes, strides, local tensors), load crosswise, and LOCAL is refused alike. A
checkpoint written with ``torch.distributed.checkpoint`` at world 4 by either FSDP loads into
either at worlds 4 and 2, and training continues bitwise alike.
"""

from __future__ import annotations

import pytest
import torch.multiprocessing as mp

try:
    from _fsdp_dtensor_workers import run_world
except ImportError as missing:  # torch 2.4: DTensor is not public yet (torch.distributed._tensor)
    pytest.skip(f"this torch has no public DTensor: {missing}", allow_module_level=True)


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_dtensor_state_dicts_and_checkpoint_round_trip(tmp_path) -> None:
    # World 4 saves (and checks the dicts there); world 2 loads its checkpoints.
    for world in (4, 2):
        mp.start_processes(
            run_world, args=(world, str(tmp_path)), nprocs=world, join=True, start_method="spawn"
        )
