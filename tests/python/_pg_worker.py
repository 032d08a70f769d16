"""One rank of the multi-process process-group tests (run by test_process_group.py).

Usage: python _pg_worker.py RANK WORLD PORT TMPDIR

Spawning is the expensive part of these tests, so one world runs every section in turn: the
three rendezvous kinds, every collective against torch's own on the same inputs (sync and async,
on the whole world and on a subgroup), PREMUL_SUM on gloo, round robin, the DETAIL wrapper and a
monitored barrier that one rank skips. Each section prints one JSON line
``{"section": ..., "rank": ..., "checks": N}`` when it passed; a failure raises, which ends the
process with a non-zero status and a traceback.
"""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as tdist

import ferrodist as dist

RANK, WORLD, PORT, TMP = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
SUB = [0, WORLD - 1]  # a non-contiguous subgroup (for WORLD 3: ranks 0 and 2)


class Checker:
    """Counts assertions, so the test can tell that no check was skipped."""

    def __init__(self) -> None:
        self.count = 0

    def equal(self, ours: Any, theirs: Any, what: str) -> None:
        if isinstance(ours, torch.Tensor):
            same = ours.dtype == theirs.dtype and torch.equal(ours, theirs)
        elif isinstance(ours, (list, tuple)) and ours and isinstance(ours[0], torch.Tensor):
            same = len(ours) == len(theirs) and all(torch.equal(a, b) for a, b in zip(ours, theirs))
        else:
            same = ours == theirs
        if not same:
            raise AssertionError(f"rank {RANK}: {what}: ferrodist {ours!r} != torch {theirs!r}")
        self.count += 1

    def true(self, cond: bool, what: str) -> None:
        if not cond:
            raise AssertionError(f"rank {RANK}: {what}")
        self.count += 1


def section(name: str, fn: Callable[[Checker], None]) -> None:
    check = Checker()
    fn(check)
    print(json.dumps({"section": name, "rank": RANK, "checks": check.count}), flush=True)


def data(seed: int, n: int = 6, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rank-dependent, deterministic input (integers kept small so products stay exact)."""
    g = torch.Generator().manual_seed(seed * 1000 + RANK)
    return torch.randint(1, 5, (n,), generator=g).to(dtype)


def rendezvous_kinds(check: Checker) -> None:
    """file://, env:// and tcp:// (query parameters) each give a working default group."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT + 1))
    os.environ.update(RANK=str(RANK), WORLD_SIZE=str(WORLD))
    urls = [
        f"file://{TMP}/rdzv_file?rank={RANK}&world_size={WORLD}",
        "env://",
        f"tcp://127.0.0.1:{PORT + 2}?rank={RANK}&world_size={WORLD}",
    ]
    for url in urls:
        dist.init_process_group("gloo", init_method=url, timeout=timedelta(seconds=60))
        check.true(tdist.is_initialized() and dist.is_initialized(), f"{url}: initialized")
        check.equal(dist.get_rank(), RANK, f"{url}: get_rank")
        check.equal(dist.get_world_size(), WORLD, f"{url}: get_world_size")
        check.equal(dist.get_backend(), "gloo", f"{url}: get_backend")
        t = torch.ones(2) * (RANK + 1)
        dist.all_reduce(t)
        check.equal(t, torch.full((2,), float(WORLD * (WORLD + 1) // 2)), f"{url}: all_reduce")
        try:
            dist.init_process_group("gloo", init_method=url)
            raise AssertionError("a second init_process_group did not raise")
        except ValueError as e:
            check.true("twice" in str(e), f"second init names the cause: {e}")
        dist.destroy_process_group()
        check.true(not dist.is_initialized(), f"{url}: destroyed")


def run_pair(check: Checker, name: str, fn: Callable[[Any], Any], async_op: bool) -> None:
    """Run ``fn`` with torch's module, then with ferrodist, and compare what each produced."""

    def run(mod: Any) -> Any:
        result, work = fn(mod)
        if async_op and work is not None:
            check.true(isinstance(work, tdist.Work), f"{name}: async returns a torch Work")
            work.wait()
        return result

    outs = []
    for mod in (tdist, dist):
        try:
            outs.append(run(mod))
        except RuntimeError as theirs:
            refused = "does not support" in str(theirs) or "Cannot use" in str(theirs)
            if mod is not tdist or not refused:
                raise
            # This torch's backend lacks the op (2.11's gloo has no alltoall, 2.4's no AVG):
            # ferrodist runs the same backend, so it must fail the same way.
            try:
                run(dist)
            except RuntimeError as ours:
                check.equal(str(ours), str(theirs), f"{name}: unsupported, as on torch")
            else:
                check.true(False, f"{name}: torch's backend refused it, ferrodist's ran it")
            return
    check.equal(outs[1], outs[0], f"{name} (async={async_op})")


def collectives_on(check: Checker, group: Any, ranks: list[int], async_op: bool) -> None:
    """Every collective, torch vs ferrodist, on ``group`` whose members are ``ranks``."""
    n, a = len(ranks), async_op
    src, dst = ranks[-1], ranks[0]
    me = ranks.index(RANK)
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    for i, op in enumerate([*ops, dist.ReduceOp.AVG]):

        def ar(m: Any, op: Any = op, i: int = i) -> Any:
            t = data(i)
            return t, m.all_reduce(t, op=op, group=group, async_op=a)

        run_pair(check, f"all_reduce {op}", ar, a)
    for i, op in enumerate([dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]):

        def ari(m: Any, op: Any = op, i: int = i) -> Any:
            t = data(10 + i, dtype=torch.int32)
            return t, m.all_reduce(t, op=op, group=group, async_op=a)

        run_pair(check, f"all_reduce int {op}", ari, a)

    def red(m: Any) -> Any:
        t = data(20)
        return (t if RANK == dst else None), m.reduce(t, dst, group=group, async_op=a)

    def bc(m: Any) -> Any:
        t = data(21)
        return t, m.broadcast(t, src, group=group, async_op=a)

    def ag(m: Any) -> Any:
        out = [torch.zeros(6) for _ in ranks]
        return out, m.all_gather(out, data(22), group=group, async_op=a)

    def agt(m: Any) -> Any:
        out = torch.zeros(6 * n)
        return out, m.all_gather_into_tensor(out, data(23), group=group, async_op=a)

    def ga(m: Any) -> Any:
        out = [torch.zeros(6) for _ in ranks] if RANK == dst else None
        return out, m.gather(data(24), out, dst, group=group, async_op=a)

    def sc(m: Any) -> Any:
        out = torch.zeros(6)
        ins = [data(25 + j) for j in range(n)] if RANK == src else None
        return out, m.scatter(out, ins, src, group=group, async_op=a)

    def rs(m: Any) -> Any:
        out = torch.zeros(6)
        return out, m.reduce_scatter(out, [data(30 + j) for j in range(n)], group=group, async_op=a)

    def rst(m: Any) -> Any:
        out = torch.zeros(6)
        return out, m.reduce_scatter_tensor(out, data(31, 6 * n), group=group, async_op=a)

    def a2a(m: Any) -> Any:
        out = [torch.zeros(3) for _ in ranks]
        ins = [data(40 + j, 3) for j in range(n)]
        return out, m.all_to_all(out, ins, group=group, async_op=a)

    def a2as(m: Any) -> Any:
        # uneven splits: rank r sends j+1 elements to member j
        send = [j + 1 for j in range(n)]
        recv = [me + 1] * n
        out = torch.zeros(sum(recv))
        w = m.all_to_all_single(out, data(41, sum(send)), recv, send, group=group, async_op=a)
        return out, w

    def p2p(m: Any) -> Any:
        nxt, prv = ranks[(me + 1) % n], ranks[(me - 1) % n]
        out = torch.zeros(6)
        if a:
            works = [m.isend(data(42), nxt, group=group), m.irecv(out, prv, group=group)]
            for w in works:
                check.true(isinstance(w, tdist.Work), "isend/irecv return torch Work")
                w.wait()
        elif me % 2 == 0:
            m.send(data(42), nxt, group=group)
            m.recv(out, prv, group=group)
        else:
            m.recv(out, prv, group=group)
            m.send(data(42), nxt, group=group)
        return out, None

    def batch(m: Any) -> Any:
        nxt, prv = ranks[(me + 1) % n], ranks[(me - 1) % n]
        out = torch.zeros(6)
        p2p_ops = [m.P2POp(m.isend, data(43), nxt, group), m.P2POp(m.irecv, out, prv, group)]
        for w in m.batch_isend_irecv(p2p_ops):
            w.wait()
        return out, None

    for name, fn in [
        ("reduce", red),
        ("broadcast", bc),
        ("all_gather", ag),
        ("all_gather_into_tensor", agt),
        ("gather", ga),
        ("scatter", sc),
        ("reduce_scatter", rs),
        ("reduce_scatter_tensor", rst),
        ("all_to_all", a2a),
        ("all_to_all_single", a2as),
        ("send/recv", p2p),
        ("batch_isend_irecv", batch),
    ]:
        run_pair(check, name, fn, a)
    w = dist.barrier(group=group, async_op=a)
    if a:
        check.true(isinstance(w, tdist.Work), "async barrier returns a torch Work")
        w.wait()


def objects_on(check: Checker, group: Any, ranks: list[int]) -> None:
    """The object variants, torch vs ferrodist."""
    src, dst, me = ranks[-1], ranks[0], ranks.index(RANK)
    obj = {"rank": RANK, "payload": list(range(RANK + 1))}
    for mod_name in ("all_gather_object", "gather_object"):
        got = []
        for m in (tdist, dist):
            out: list[Any] = [None] * len(ranks)
            if mod_name == "all_gather_object":
                m.all_gather_object(out, obj, group=group)
            else:
                m.gather_object(obj, out if RANK == dst else None, dst, group=group)
            got.append(out)
        check.equal(got[1], got[0], mod_name)
    got = []
    for m in (tdist, dist):
        lst = [obj, "x"] if RANK == src else [None, None]
        m.broadcast_object_list(lst, src, group=group)
        got.append(lst)
    check.equal(got[1], got[0], "broadcast_object_list")
    got = []
    for m in (tdist, dist):
        out = [None]
        ins = [{"to": j} for j in range(len(ranks))] if RANK == src else None
        m.scatter_object_list(out, ins, src, group=group)
        got.append(out)
    check.equal(got[1], got[0], "scatter_object_list")
    got = []
    for m in (tdist, dist):
        lst: list[Any] = [obj] if me == 0 else [None]
        if me == 0:
            m.send_object_list(lst, ranks[1], group=group)
        elif me == 1:
            m.recv_object_list(lst, ranks[0], group=group)
        got.append(lst)
    check.equal(got[1], got[0], "send/recv_object_list")


def collectives(check: Checker) -> None:
    url = f"tcp://127.0.0.1:{PORT}"
    dist.init_process_group("gloo", init_method=url, rank=RANK, world_size=WORLD)
    world = list(range(WORLD))
    before = check.count
    for a in (False, True):
        collectives_on(check, None, world, a)
    objects_on(check, None, world)
    tables = {"world": check.count - before, "subgroup": 0}
    sub = dist.new_group(SUB)
    if RANK in SUB:
        check.true(isinstance(sub, tdist.ProcessGroup), "new_group returns a torch ProcessGroup")
    else:
        check.true(sub is dist.GroupMember.NON_GROUP_MEMBER, "non-members get NON_GROUP_MEMBER")
    check.equal(
        dist.get_process_group_ranks(sub), tdist.get_process_group_ranks(sub), "group ranks"
    )
    if RANK in SUB:
        check.equal(dist.get_group_rank(sub, RANK), SUB.index(RANK), "get_group_rank")
        check.equal(dist.get_global_rank(sub, SUB.index(RANK)), RANK, "get_global_rank")
        before = check.count
        for a in (False, True):
            collectives_on(check, sub, SUB, a)
        objects_on(check, sub, SUB)
        tables["subgroup"] = check.count - before
    else:
        check.true(dist.all_reduce(torch.ones(1), group=sub) is None, "non-member gets None")
    mine, groups = dist.new_subgroups_by_enumeration([SUB, [r for r in world if r not in SUB]])
    check.equal(dist.get_process_group_ranks(mine), SUB if RANK in SUB else world[1:-1], "enum")
    check.equal(len(groups), 2, "new_subgroups_by_enumeration makes every group")
    t = torch.ones(1)
    dist.all_reduce(t, group=mine)
    check.equal(t, torch.full((1,), float(dist.get_world_size(mine))), "subgroup all_reduce")
    print(json.dumps({"section": "tables", "rank": RANK, "checks": tables}), flush=True)


def premul_sum(check: Checker) -> None:
    """PREMUL_SUM, which gloo rejects, gives factor * sum through ferrodist."""
    for factor in (2.5, torch.tensor(3.0)):
        op = dist._make_nccl_premul_sum(factor)
        total = sum(_data_of(r, 50) for r in range(WORLD))
        want = total * float(factor)
        t = data(50, dtype=torch.float64)
        dist.all_reduce(t, op=op)
        check.equal(t, want, f"all_reduce PREMUL_SUM {factor}")
        t = data(50, dtype=torch.float64)
        before = t.clone()
        dist.reduce(t, 0, op=op)
        check.equal(t, want if RANK == 0 else before, f"reduce PREMUL_SUM {factor}")
        out = torch.zeros(2, dtype=torch.float64)
        dist.reduce_scatter_tensor(out, data(50, n=2 * WORLD, dtype=torch.float64), op=op)
        full = sum(_data_of(r, 50, 2 * WORLD) for r in range(WORLD)) * float(factor)
        check.equal(out, full[2 * RANK : 2 * RANK + 2], "reduce_scatter_tensor PREMUL_SUM")
        out = torch.zeros(2, dtype=torch.float64)
        ins = list(data(50, n=2 * WORLD, dtype=torch.float64).split(2))
        try:
            work = dist.reduce_scatter(out, ins, op=op, async_op=True)
        except RuntimeError as err:
            # torch 2.4's gloo has no list reduce_scatter at all, for any op.
            check.true("does not support reduce_scatter" in str(err), f"reduce_scatter: {err}")
            continue
        work.wait()
        check.equal(out, full[2 * RANK : 2 * RANK + 2], "reduce_scatter PREMUL_SUM async")


def _data_of(rank: int, seed: int, n: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randint(1, 5, (n,), generator=g).to(torch.float64)


def round_robin(check: Checker) -> None:
    pgs = [dist.new_group(backend="gloo") for _ in range(2)]
    rr = dist._round_robin_process_groups(pgs)
    check.true(isinstance(rr, tdist.ProcessGroup), "round robin is a ProcessGroup")
    check.equal((rr.rank(), rr.size()), (RANK, WORLD), "round robin rank and size")
    works = []
    tensors = [torch.full((4,), float(i + RANK)) for i in range(4)]
    for t in tensors:
        works.append(rr.allreduce([t]))
    for w in works:
        w.wait()
    for i, t in enumerate(tensors):
        want = float(i * WORLD + WORLD * (WORLD - 1) // 2)
        check.equal(t, torch.full((4,), want), f"round robin allreduce {i}")
    check.equal(rr.process_groups, pgs, "round robin keeps its groups in order")
    t = torch.full((3,), float(RANK))
    dist.all_reduce(t, group=rr)  # torch's free function, through the round robin's methods
    check.equal(t, torch.full((3,), float(WORLD * (WORLD - 1) // 2)), "all_reduce(group=rr)")


def wrapper_detail(check: Checker) -> None:
    """At DebugLevel DETAIL a shape mismatch raises naming the ranks instead of hanging."""
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    check.equal(dist.get_debug_level(), dist.DebugLevel.DETAIL, "set_debug_level")
    g = dist.new_group(backend="gloo")
    t = torch.zeros(2 if RANK == 0 else 3)
    try:
        dist.all_reduce(t, group=g)
        raise AssertionError("mismatched all_reduce did not raise")
    except RuntimeError as e:
        msg = str(e)
        named = set(re.findall(r"Rank (\d+)", msg))
        check.true("mismatch" in msg and "0" in named and len(named) >= 2, f"names ranks: {msg}")
    dist.set_debug_level(dist.DebugLevel.OFF)


def monitored(check: Checker) -> None:
    """A monitored barrier names the rank that never arrived (rank 1 skips it)."""
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    check.count += 1
    g = dist.new_group(backend="gloo")
    if RANK == 1:
        return
    try:
        dist.monitored_barrier(g, timeout=timedelta(seconds=2), wait_all_ranks=True)
        raise AssertionError("monitored_barrier passed with rank 1 absent")
    except RuntimeError as e:
        if RANK == 0:
            check.true("1" in str(e) and "monitoredBarrier" in str(e), f"names rank 1: {e}")


if __name__ == "__main__":
    section("rendezvous", rendezvous_kinds)
    section("collectives", collectives)
    section("premul_sum", premul_sum)
    section("round_robin", round_robin)
    section("wrapper_detail", wrapper_detail)
    section("monitored_barrier", monitored)
    sys.stdout.flush()
    os._exit(0)  # the failed monitored barrier leaves gloo work behind; don't wait on it
