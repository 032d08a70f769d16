"""ferrodist's FSDP on CUDA with NCCL (one process, one GPU); skipped where there is no GPU.

torch's FSDP and ferrodist's train the same model from the same seed on the same NCCL group;
losses and the full state dict must be bit-identical, for every strategy that runs at world 1,
with and without mixed precision, ``use_orig_params`` and ``CPUOffload(offload_params=True)``
(where the shards, their gradients and the optimizer state must stay on the host).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from ferrodist.fsdp import FullyShardedDataParallel as FerroFSDP


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.Linear(64, 4)
    ).cuda()


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
@pytest.mark.parametrize("use_orig_params", [False, True])
@pytest.mark.parametrize("mixed", [None, torch.bfloat16])
@pytest.mark.parametrize("offload", [False, True])
def test_cuda_fsdp_matches_torch(
    nccl_world: Any, strategy: str, use_orig_params: bool, mixed: Any, offload: bool
) -> None:
    _train_both_and_compare(strategy, use_orig_params, mixed, offload, set_to_none=True)


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("use_orig_params", [False, True])
def test_cuda_offload_with_gradients_zeroed_in_place_matches_torch(
    nccl_world: Any, use_orig_params: bool
) -> None:
    """``zero_grad(set_to_none=False)`` keeps a host gradient every step, so each new one is
    added to it on arrival (the accumulation path of the offload)."""
    _train_both_and_compare("FULL_SHARD", use_orig_params, None, True, set_to_none=False)


def _train_both_and_compare(
    strategy: str, use_orig_params: bool, mixed: Any, offload: bool, set_to_none: bool
) -> None:
    base = _model().cpu()  # device_id moves it, as torch's does
    results = {}
    for kind, cls in (("torch", TorchFSDP), ("ferrodist", FerroFSDP)):
        fsdp = cls(
            copy.deepcopy(base),
            sharding_strategy=ShardingStrategy[strategy],
            auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
            mixed_precision=None if mixed is None else MixedPrecision(param_dtype=mixed),
            use_orig_params=use_orig_params,
            cpu_offload=CPUOffload(offload_params=offload),
            device_id=torch.cuda.current_device(),
        )
        opt = torch.optim.Adam(fsdp.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(3):
            # A CPU batch: the root moves its inputs to the compute device.
            loss = fsdp(torch.randn(8, 32, generator=g)).float().square().mean()
            loss.backward()
            if offload:
                # Sharded parameters, their gradients and the optimizer step stay on the host.
                assert all(p.device.type == "cpu" for p in fsdp.parameters()), kind
                assert all(
                    p.grad is None or p.grad.device.type == "cpu" for p in fsdp.parameters()
                ), kind
            fsdp.clip_grad_norm_(1.0)
            opt.step()
            opt.zero_grad(set_to_none=set_to_none)
            losses.append(loss.detach().cpu())
        if offload:
            for entry in opt.state.values():
                assert all(
                    v.device.type == "cpu" for v in entry.values() if isinstance(v, torch.Tensor)
                ), kind
        with cls.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT):
            state = {k: v.detach().cpu() for k, v in fsdp.state_dict().items()}
        results[kind] = (losses, state)
    (torch_losses, torch_state), (ours_losses, ours_state) = results["torch"], results["ferrodist"]
    assert all(torch.equal(a, b) for a, b in zip(torch_losses, ours_losses))
    assert torch_state.keys() == ours_state.keys()
    for key in torch_state:
        assert torch.equal(torch_state[key], ours_state[key]), key
