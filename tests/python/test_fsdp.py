"""ferrodist's FullyShardedDataParallel against torch's, in real processes on gloo.

The API names are torch's own objects; the runtime is checked by running torch's FSDP and
ferrodist's side by side in one forked world per world size (see ``_fsdp_workers``): every
sharding strategy, ``use_orig_params`` on and off, auto-wrapped and single-unit models, SGD and
Adam, with bit-identical losses, full state dicts and optimizer states asserted.
"""

from __future__ import annotations

import pytest
import torch.distributed.fsdp as torch_fsdp
import torch.multiprocessing as mp
from _fsdp_workers import run_world

import ferrodist.fsdp as ferro_fsdp


def test_all_is_torchs_and_names_are_torchs_objects() -> None:
    assert ferro_fsdp.__all__ == list(torch_fsdp.__all__)
    for name in torch_fsdp.__all__:
        if name == "FullyShardedDataParallel":
            assert ferro_fsdp.FullyShardedDataParallel is not torch_fsdp.FullyShardedDataParallel
        else:
            assert getattr(ferro_fsdp, name) is getattr(torch_fsdp, name), name


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 4])
def test_training_parity_with_torch(tmp_path, world: int) -> None:
    # fork: the children inherit the imported torch (spawning costs seconds per world).
    mp.start_processes(
        run_world, args=(world, str(tmp_path)), nprocs=world, join=True, start_method="fork"
    )
