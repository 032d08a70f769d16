"""ZeroRedundancyOptimizer: ferrodist vs torch, side by side, on gloo (CPU).

For a ~50M-parameter model (12 x Linear(2048, 2048), Adam) at world sizes 2 and 4:

* step time (local Adam step on the shard + parameter sync), bucket view off and on; both
  implementations run in the same processes, steps interleaved, median of the timed steps;
* per-rank optimizer-state bytes, against the unsharded optimizer's (target: 1/W);
* ``consolidate_state_dict(to=0)`` + ``state_dict()`` peak memory: the rise of the resident
  set's high-water mark (VmHWM, reset through /proc/self/clear_refs) over the resident set
  before the call, on the receiving rank and (max) on the other ranks. Each implementation gets
  fresh processes for this, so neither inherits the other's heap.

Prints one markdown table; ratio = ferrodist / torch (lower is better for every row).
Run: ``./scripts/bench benches/bench_zero.py`` (``--quick`` for a small model,
``--timing-only`` to skip the consolidation rows).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

from ferrodist.optim import ZeroRedundancyOptimizer as FerroZero

QUICK = "--quick" in sys.argv
TIMING_ONLY = "--timing-only" in sys.argv  # skip the consolidation rows (torch's take minutes)
WIDTH, LAYERS = (512, 4) if QUICK else (2048, 12)
TIMED_STEPS = 3 if QUICK else 7
IMPLS = {"ferrodist": FerroZero, "torch": TorchZero}


def model() -> nn.Module:
    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    for p in layers.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    return layers


def init(rank: int, world: int, tmp: str, tag: str) -> None:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # deep MLPs decay into subnormals: benches/README.md
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/pg-{tag}", rank=rank, world_size=world
    )


def state_bytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def timing_worker(rank: int, world: int, tmp: str, out: Any) -> None:
    init(rank, world, tmp, f"time-{world}")
    results = {}
    for bucket_view in (False, True):
        setups = {}
        for name, cls in IMPLS.items():
            m = model()
            setups[name] = cls(
                m.parameters(), torch.optim.Adam, parameters_as_bucket_view=bucket_view, lr=1e-4
            )
            setups[name].step()  # warm-up: creates the Adam state
        times: dict[str, list[float]] = {name: [] for name in IMPLS}
        for step in range(TIMED_STEPS):
            # Alternate which implementation goes first after the barrier, so neither pays
            # for (or profits from) the other's stragglers every time.
            order = list(setups.items())
            for name, opt in order if step % 2 == 0 else reversed(order):
                dist.barrier()
                start = time.perf_counter()
                opt.step()
                times[name].append(time.perf_counter() - start)
        for name, opt in setups.items():
            local = state_bytes(opt.optim.state)
            all_local = [0] * world
            dist.all_gather_object(all_local, local)
            results[(name, bucket_view)] = (statistics.median(times[name]), max(all_local))
        del setups
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def memory_worker(rank: int, world: int, tmp: str, impl: str, out: Any) -> None:
    init(rank, world, tmp, f"mem-{world}-{impl}")
    m = model()
    opt = IMPLS[impl](m.parameters(), torch.optim.Adam, lr=1e-4)
    opt.step()
    dist.barrier()
    before = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    start = time.perf_counter()
    opt.consolidate_state_dict(to=0)
    if rank == 0:
        sd = opt.state_dict()
        total_state = state_bytes(sd["state"])
    elapsed = time.perf_counter() - start
    peak = (_rss_kib("VmHWM") - before) * 1024
    peaks = [0] * world
    dist.all_gather_object(peaks, peak)
    if rank == 0:
        out.put(
            {
                "peak_to": peaks[0],
                "peak_others": max(peaks[1:]),
                "state": total_state,
                "time": elapsed,
            }
        )
    dist.destroy_process_group()


def run(fn: Any, world: int, *args: Any) -> Any:
    ctx = mp.get_context("fork")
    out = ctx.SimpleQueue()
    mp.start_processes(fn, args=(world, *args, out), nprocs=world, join=True, start_method="fork")
    return out.get()


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main() -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    tmp = tempfile.mkdtemp()
    numel = sum(p.numel() for p in model().parameters())
    unsharded = 2 * 4 * numel  # Adam: exp_avg + exp_avg_sq, fp32 (plus a scalar step each)
    rows = []
    for world in (2, 4):
        timing = run(timing_worker, world, tmp)
        for bucket_view in (False, True):
            f_time, f_state = timing[("ferrodist", bucket_view)]
            t_time, t_state = timing[("torch", bucket_view)]
            label = f"step time, W={world}, bucket view {'on' if bucket_view else 'off'}"
            rows.append(
                (label, f"{f_time * 1e3:.0f} ms", f"{t_time * 1e3:.0f} ms", f_time / t_time)
            )
            if bucket_view:
                continue
            rows.append(
                (
                    f"max per-rank Adam state / unsharded, W={world} (target {1 / world:.2f})",
                    f"{f_state / unsharded:.3f}",
                    f"{t_state / unsharded:.3f}",
                    f_state / t_state,
                )
            )
        if TIMING_ONLY:
            continue
        mem = {impl: run(memory_worker, world, tmp, impl) for impl in IMPLS}
        f, t = mem["ferrodist"], mem["torch"]
        rows.append(
            (
                f"consolidate peak on rank 0, W={world}",
                mib(f["peak_to"]),
                mib(t["peak_to"]),
                f["peak_to"] / max(t["peak_to"], 1),
            )
        )
        rows.append(
            (
                f"consolidate peak on other ranks (max), W={world}",
                mib(f["peak_others"]),
                mib(t["peak_others"]),
                f["peak_others"] / max(t["peak_others"], 1),
            )
        )
        rows.append(
            (
                f"consolidate + state_dict time, W={world}",
                f"{f['time'] * 1e3:.0f} ms",
                f"{t['time'] * 1e3:.0f} ms",
                f["time"] / t["time"],
            )
        )
        assert f["state"] == t["state"]
    print(f"\nmodel: {numel / 1e6:.1f}M parameters, Adam; full optimizer state {mib(unsharded)}\n")
    print("| figure | ferrodist | torch | ratio |")
    print("|---|---|---|---|")
    for label, ours, theirs, ratio in rows:
        print(f"| {label} | {ours} | {theirs} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
