"""Real processes: torch ranks and ferrodist ranks in the same collectives on torch's TCPStore.

Two worker processes host two ranks each (one thread and one torch ``TCPStore`` client per
rank, all on one server in the test process); ranks 0 and 2 run torch's ``_StoreCollectives``,
ranks 1 and 3 run ``ferrodist.StoreCollectives`` (over the torch client, through ferrodist's
foreign-store adapter), so each process has one of each. Roots are placed on both sides.
Then rank 3 stays away from one all_gather, and every other rank, torch's or ours, must time
out naming rank 3.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest
import torch.distributed as tdist

WORKER = r"""
import json, sys, threading
from datetime import timedelta
import torch.distributed as tdist
import ferrodist

world, port = int(sys.argv[1]), int(sys.argv[2])
ranks = {int(r): impl for r, impl in (a.split(":") for a in sys.argv[3:])}
T = timedelta(seconds=60)
results = {}

def rank_main(rank, impl):
    store = tdist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=T)
    cls = tdist._StoreCollectives if impl == "torch" else ferrodist.StoreCollectives
    try:
        results[rank] = run(cls(store, rank, world), rank, impl)
    except BaseException as err:
        results[rank] = {"error": repr(err)}

def run(c, rank, impl):
    out = {}
    c.barrier("start", T)
    out["all_gather"] = [v.hex() for v in c.all_gather("ag", f"rank{rank}-{impl}", T)]
    out["all_sum"] = c.all_sum("sum", 10 ** rank, T)
    if rank == 1:
        c.broadcast_send("bc", "from ferrodist rank 1", T)
    else:
        out["broadcast"] = c.broadcast_recv("bc", T).hex()
    if rank == 0:
        out["gather"] = [v.hex() for v in c.gather_recv("g", "root0", T)]
    else:
        c.gather_send("g", f"g{rank}", T)
    if rank == 3:
        out["scatter"] = c.scatter_send("sc", [f"to{i}" for i in range(world)], T).hex()
    else:
        out["scatter"] = c.scatter_recv("sc", T).hex()
    c.barrier("nonblocking", T, False)
    c.barrier("end", T)
    if rank != 3:
        try:
            c.all_gather("late", "x", timedelta(milliseconds=500))
            out["late"] = "no error"
        except RuntimeError as err:
            out["late"] = str(err).splitlines()[0]
    return out

threads = [threading.Thread(target=rank_main, args=item) for item in ranks.items()]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(results))
"""

WORLD = 4
IMPLS = ["torch", "ferrodist", "torch", "ferrodist"]


@pytest.mark.timeout(180)
@pytest.mark.skipif(
    not hasattr(tdist, "_StoreCollectives"),
    reason="this torch has no _StoreCollectives to share with (2.15 removed it)",
)
def test_torch_and_ferrodist_ranks_share_collectives_on_tcpstore() -> None:
    master = tdist.TCPStore(
        "127.0.0.1",
        0,
        WORLD,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
    )
    hosted = [[0, 1], [2, 3]]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(WORLD), str(master.port)]
            + [f"{r}:{IMPLS[r]}" for r in ranks],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for ranks in hosted
    ]
    by_rank: dict[int, dict] = {}
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=150)
            assert proc.returncode == 0, stderr[-3000:]
            for rank, out in json.loads(stdout.strip().splitlines()[-1]).items():
                assert "error" not in out, out
                by_rank[int(rank)] = out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def hexed(text: str) -> str:
        return text.encode().hex()

    outputs = [by_rank[r] for r in range(WORLD)]
    gathered = [hexed(f"rank{r}-{IMPLS[r]}") for r in range(WORLD)]
    for rank, out in enumerate(outputs):
        assert out["all_gather"] == gathered
        assert out["all_sum"] == 1111
        assert out["scatter"] == hexed(f"to{rank}")
        if rank != 1:
            assert out["broadcast"] == hexed("from ferrodist rank 1")
        if rank != 3:
            assert out["late"].startswith("all_gather failed -- missing ranks: 3, "), out["late"]
    assert outputs[0]["gather"] == [hexed(t) for t in ["root0", "g1", "g2", "g3"]]
    # torch's key layout, whoever wrote it
    assert master.get("end/num_members") == b"4"
    assert master.get("sum") == b"1111"
    assert master.check(["g/1", "g/2", "g/3", "sc/0", "sc/1", "sc/2"])
    assert not master.check(["g/0"]) and not master.check(["sc/3"])
