"""ferrodist's FullyShardedDataParallel against torch's, in real processes on gloo.

The API names are torch's own objects; the runtime is checked by running torch's FSDP and
ferrodist's side by side in one forked world per world size (see ``_fsdp_workers``): every
sharding strategy, ``use_orig_params`` on and off, auto-wrapped and single-unit models, SGD and
Adam, with bit-identical losses, full state dicts and optimizer states asserted; then
``summon_full_params``, ``no_sync``, ``clip_grad_norm_`` against torch's, and FULL checkpoints
moved between torch's FSDP and ferrodist's and between world sizes (2 -> 4 -> 3).
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


def test_divide_factors_are_torchs() -> None:
    from torch.distributed.algorithms._comm_hooks.default_hooks import DefaultState

    from ferrodist.fsdp._runtime import predivide_factor

    for world in range(1, 130):
        assert predivide_factor(world) == DefaultState._get_gradient_predivide_factor(world)


def test_wrap_policies_are_torchs() -> None:
    import torch.distributed.fsdp.wrap as torch_wrap

    import ferrodist.fsdp.wrap as ferro_wrap

    for name in ferro_wrap.__all__:
        assert getattr(ferro_wrap, name) is getattr(torch_wrap, name), name


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_parity_and_checkpoints_across_world_sizes(tmp_path) -> None:
    # World 2 runs the whole matrix (and summon_full_params, no_sync, clip_grad_norm_); 4 and
    # 3 a few configurations each, and load the FULL checkpoint the previous world saved.
    for world, load_from in [(2, None), (4, 2), (3, 4)]:
        # spawn, not fork: a forked child of a pytest process that made a gloo group earlier
        # (test_ddp_single does) hangs in its first collective.
        mp.start_processes(
            run_world,
            args=(world, str(tmp_path), load_from),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
