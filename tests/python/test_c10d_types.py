"""The torch.distributed names ferrodist exports are torch's own objects, or clear stand-ins.

Drop-in means ``isinstance`` checks, ``except`` clauses and torch code that receives these
objects all behave as with ``torch.distributed``; the simplest proof is identity.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.distributed as tdist
import torch.distributed.distributed_c10d as c10d

import ferrodist as dist
from ferrodist import _torch_names

TORCH_OBJECTS = [
    "ProcessGroup", "Work", "ReduceOp", "AllreduceOptions", "AllreduceCoalescedOptions",
    "BroadcastOptions", "ReduceOptions", "AllgatherOptions", "GatherOptions", "ScatterOptions",
    "ReduceScatterOptions", "AllToAllOptions", "BarrierOptions", "Backend", "BackendConfig",
    "DebugLevel", "get_debug_level", "set_debug_level", "GroupMember", "group",
    "_broadcast_coalesced", "_verify_params_across_processes", "_ProcessGroupWrapper",
    "_register_process_group", "_resolve_process_group", "_unregister_process_group",
    "_unregister_all_process_groups", "_set_global_rank", "_hash_tensors",
    "_make_nccl_premul_sum", "_test_python_store", "ProcessGroupGloo", "ProcessGroupNCCL",
    "_DistributedBackendOptions", "P2POp", "batch_isend_irecv", "is_initialized", "get_rank",
    "get_world_size",
    "get_backend", "new_group", "new_subgroups", "new_subgroups_by_enumeration",
    "get_process_group_ranks", "get_global_rank", "get_group_rank",
]  # fmt: skip
WRAPPED = [
    "all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "init_process_group",
    "destroy_process_group",
    # recorded in the flight recorder (ferrodist.debug) on their way to torch
    "broadcast", "all_gather", "all_gather_into_tensor", "gather", "scatter", "all_to_all",
    "all_to_all_single", "send", "recv", "isend", "irecv", "barrier", "monitored_barrier",
    "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
    "send_object_list", "recv_object_list", "all_reduce_coalesced", "all_gather_coalesced",
]  # fmt: skip


@pytest.mark.parametrize("name", TORCH_OBJECTS + _torch_names.VERSION_SPECIFIC)
def test_name_is_torchs_own_object_where_this_torch_has_it(name: str):
    theirs = getattr(tdist, name, None) or getattr(c10d, name, None)
    theirs = theirs or getattr(torch._C._distributed_c10d, name, None)
    if theirs is None:
        # A name of another torch version: not invented here either.
        assert not hasattr(dist, name) and name not in dist.__all__, name
        return
    assert getattr(dist, name) is theirs
    assert name in dist.__all__


@pytest.mark.parametrize("name", WRAPPED)
def test_wrapped_names_keep_torchs_signature(name: str):
    import inspect

    ours = inspect.signature(getattr(dist, name)).parameters
    named = [p for p, v in ours.items() if v.kind is not v.VAR_KEYWORD]
    theirs = [p for p in inspect.signature(getattr(tdist, name)).parameters if p != "_ranks"]
    # Same parameters in the same order. ``reduce``'s ``group_dst`` (torch >= 2.6) stays in
    # ours on older torch, which then rejects it; torch's newer keywords (2.15's
    # ``enable_reconfigure``) reach it through ``**torch_options``.
    if name == "reduce" and "group_dst" not in theirs:
        theirs.append("group_dst")
    assert named == theirs[: len(named)]
    if len(theirs) > len(named):
        assert any(v.kind is v.VAR_KEYWORD for v in ours.values()), theirs[len(named) :]
    # torch's logging and users' tracebacks read the function's name: the public one.
    assert getattr(dist, name).__name__ == name


def test_reduce_op_has_every_member():
    for member in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        assert getattr(dist.ReduceOp, member) == getattr(tdist.ReduceOp, member)
    op = dist._make_nccl_premul_sum(2.0)
    assert isinstance(op, tdist.ReduceOp)


def test_debug_level_round_trips():
    before = dist.get_debug_level()
    try:
        dist.set_debug_level(dist.DebugLevel.INFO)
        assert tdist.get_debug_level() == dist.DebugLevel.INFO
    finally:
        dist.set_debug_level(before)


@pytest.mark.skipif(tdist.is_ucc_available(), reason="this torch has UCC")
def test_ucc_stand_in_raises_a_clear_error():
    with pytest.raises(RuntimeError, match="built without UCC"):
        dist.ProcessGroupUCC(tdist.HashStore(), 0, 1)
    assert not dist.is_ucc_available()


@pytest.mark.skipif(tdist.is_mpi_available(), reason="this torch has MPI")
def test_mpi_stand_in_raises_a_clear_error():
    with pytest.raises(RuntimeError, match="built without MPI"):
        dist.ProcessGroupMPI.create([0])


def test_round_robin_rejects_empty_and_non_groups():
    with pytest.raises(ValueError, match="at least one"):
        dist._round_robin_process_groups([])
    with pytest.raises(TypeError, match="ProcessGroup"):
        dist.ProcessGroupRoundRobin([object()])  # type: ignore[list-item]
    assert issubclass(dist.ProcessGroupRoundRobin, tdist.ProcessGroup)


class _Recorder(tdist.ProcessGroup):
    """A one-rank group that records which collective it was asked to run."""

    def __init__(self) -> None:
        super().__init__(0, 1)
        self.calls: list[tuple[str, tuple]] = []

    def allreduce(self, *args):  # type: ignore[override]
        self.calls.append(("allreduce", args))
        return "work"

    def broadcast(self, *args):  # type: ignore[override]
        self.calls.append(("broadcast", args))
        return "work"


def test_round_robin_hands_each_call_to_the_next_group_in_turn():
    first, second = _Recorder(), _Recorder()
    rr = dist._round_robin_process_groups([first, second])
    assert isinstance(rr, tdist.ProcessGroup) and (rr.rank(), rr.size()) == (0, 1)
    assert rr.allreduce(["a"]) == "work"
    rr.broadcast(["b"])
    rr.allreduce(["c"])
    assert first.calls == [("allreduce", (["a"],)), ("allreduce", (["c"],))]
    assert second.calls == [("broadcast", (["b"],))]
    assert rr.process_groups == [first, second]


_MISSING_NAMES = """
import inspect
import torch.distributed as tdist
import ferrodist
# What torch.distributed happens to import for itself (which varies by version: 2.4 has os,
# io, pdb and Enum, 2.15 contextlib), not API: modules and classes from outside torch.
def incidental(name):
    obj = getattr(tdist, name)
    if inspect.ismodule(obj):
        return not obj.__name__.startswith("torch.distributed")
    if inspect.isclass(obj):
        return not obj.__module__.startswith("torch")
    return name in {"log", "timedelta"}
print([n for n in dir(tdist)
       if not n.startswith("_") and not incidental(n) and not hasattr(ferrodist, n)])
"""


def test_every_public_torch_distributed_name_is_there():
    # In a fresh interpreter: importing a submodule (torch.distributed.fsdp) anywhere in this
    # process adds it to torch.distributed's names.
    out = subprocess.run(
        [sys.executable, "-c", _MISSING_NAMES], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_names_ferrodist_adds_nothing_to_are_torchs_own():
    for name in ("DeviceMesh", "init_device_mesh", "breakpoint", "register_rendezvous_handler"):
        assert getattr(dist, name) is getattr(tdist, name), name
    assert dist.distributed_c10d is c10d
    assert dist.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook is not None
