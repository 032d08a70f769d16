"""The flight recorder's cost: per op, and on DDP and FSDP steps, recording on vs off.

Part 1 (one process, gloo world of 1): the time of one ``ferrodist.all_reduce`` of a 4-element
tensor (a) through torch directly, (b) through ferrodist with recording off, (c) with it on;
(c) - (b) is what recording adds to an op. The same for an asynchronous all-reduce and its
wait (the polled completion) and a broadcast. A control times torch's own all_reduce with a
busy wait of a few microseconds beside it: what any work between two ops costs on this machine.
Then the same calls with the backend replaced by a stub that returns at once (``--stub-only``
stops there): the recorder's own Python and Rust on each path, with no machine effect in it.

Part 2 (world 2, gloo): first the same per op, for a synchronous all_reduce and for a waited
isend and irecv each way (a pipeline's exchange, point-to-point works held until they finish;
``--per-op-only`` stops there); then a model trained with ferrodist's DDP and with ferrodist's
FSDP (one unit per layer: an all-gather and a reduce-scatter per layer per step). ``--model
mlp`` (the default) is ``--layers`` x ``Linear(w, w)`` on ``--batch`` (16) rows with small DDP
buckets: every op is latency-bound, the recorder's worst case. ``--model transformer`` is a stack of
``TransformerEncoderLayer`` (``--width``, ``--heads``, 4 x width feed-forward) on ``--batch`` x
``--seq`` tokens, the shape users train, with DDP's default buckets (``--bucket-mb 25``). Steps are
timed in pairs, one with recording on and one off, back to back in the same processes (the recorder
is switched off by hiding it, as ``FERRODIST_FLIGHT_RECORDER=0`` does at start), so that machine
noise, which on a small shared machine moves whole steps by several percent, hits both halves of a
pair alike. The figure is the median of the pairs' on / off ratios with a bootstrap 95 % interval,
for the step's wall time and for the stepping thread's CPU time (on CPU the backward and every hook
run on it: what the recorder's calls cost, without the waits that make wall time noisy), beside the
recorder's own work per step (its calls timed alone x ops per step). The watchdog thread runs
throughout, as it does in a job. ``--pin`` puts each rank, with its backend's threads, on a core
of its own, as two hosts would have: the two ranks then stop taking each other's core, which on a
2-core machine moves a latency-bound step's wall time more than anything the recorder does.
``--runs K`` repeats the steps in K fresh pairs of processes and prints the mean of the runs'
CPU ratios: a run's ratio moves with its processes' memory layout by more than its interval.

    ./scripts/bench benches/flight_overhead.py [--layers 200] [--width 32] [--pairs 100]
    ./scripts/bench benches/flight_overhead.py --stub-only   # per op, world 1 and the stub rows
    ./scripts/bench benches/flight_overhead.py --pin --runs 8 --pairs 20   # steps, over 8 runs
    ./scripts/bench benches/flight_overhead.py --skip-per-op --model transformer --layers 4 \
        --width 256 --heads 4 --batch 8 --seq 128 --bucket-mb 25
    python benches/flight_overhead.py --cuda --ops 5000   # part 1 on NCCL, with a profile
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import socket
import statistics
import time
from datetime import timedelta
from typing import Any, Callable

import torch

import ferrodist as dist
from ferrodist.debug import _recorder


def _switch(on: bool, saved: Any) -> None:
    _recorder._State.decided = True
    _recorder._State.recorder = saved if on else None


def _per_op(fn: Callable[[], Any], n: int) -> float:
    for _ in range(n // 10):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def part1(n: int, cuda: bool = False) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    saved = _recorder.recorder()
    t = torch.ones(4, device="cuda" if cuda else "cpu")
    torch_all_reduce = torch.distributed.all_reduce
    cases = {
        "all_reduce": lambda: dist.all_reduce(t),
        "all_reduce async + wait": lambda: dist.all_reduce(t, async_op=True).wait(),
        "broadcast": lambda: dist.broadcast(t, 0),
    }
    print(f"per op, world 1, {backend}, median of 5 runs of {n} ops (microseconds)")
    print(f"{'op':<26}{'torch':>9}{'off':>9}{'on':>9}{'on - off':>10}")
    for name, fn in cases.items():
        rows: dict[str, list[float]] = {"torch": [], "off": [], "on": []}
        for _ in range(5):
            if name == "all_reduce":
                rows["torch"].append(_per_op(lambda: torch_all_reduce(t), n))
            for mode in ("off", "on"):
                _switch(mode == "on", saved)
                rows[mode].append(_per_op(fn, n))
        med = {k: statistics.median(v) if v else float("nan") for k, v in rows.items()}
        print(
            f"{name:<26}{med['torch']:>9.1f}{med['off']:>9.1f}{med['on']:>9.1f}"
            f"{med['on'] - med['off']:>10.1f}"
        )
    if not cuda:
        _spin_control(t, n)
    _switch(True, saved)
    if cuda:
        _profile_recorded(lambda: dist.all_reduce(t), n)
    dist.destroy_process_group()


class _StubWork:
    """A work that has already finished, as a gloo collective's is once run (its future done)."""

    def __init__(self) -> None:
        self._future: torch.futures.Future[Any] = torch.futures.Future()
        self._future.set_result(None)

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> Any:
        return self._future


def stub_rows(n: int) -> None:
    """What recording adds to a call when the backend costs nothing: each op's torch function
    replaced by a stub that returns at once (a finished work when asynchronous), so no machine
    effect (a backend thread woken, caches it took) is in the figure. The recorder's Python and
    Rust work alone, per call, on the paths ops take: a user's synchronous and asynchronous
    all_reduce on a CPU tensor, and an FSDP-style internal all-gather issued from a scope's frame
    (``_call_site.scope_of``), as FSDP's forward issues it. On a GPU whose steps are bound by
    launching ops from Python, this is what each recorded op adds to the step."""
    import sys

    from ferrodist._recorded_ops import collective
    from ferrodist.debug._call_site import scope_of

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    saved = _recorder.recorder()
    t = torch.ones(4)
    done = _StubWork()

    def stub_all_reduce(
        tensor: torch.Tensor,
        op: Any = torch.distributed.ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        return done if async_op else None

    def stub_all_gather(
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        return done if async_op else None

    recorded_all_reduce = collective("all_reduce", stub_all_reduce, "tensor", "op")
    internal_all_gather = collective(
        "fsdp.all_gather", stub_all_gather, "input_tensor", internal=True
    )
    out = torch.ones(8)

    def in_scope() -> None:
        with scope_of(sys._getframe()):
            for _ in range(10):
                internal_all_gather(out, t, async_op=True).wait()

    cases: dict[str, tuple[Callable[[], Any], int]] = {
        "all_reduce": (lambda: recorded_all_reduce(t), 1),
        "all_reduce async + wait": (lambda: recorded_all_reduce(t, async_op=True).wait(), 1),
        "internal, 10 in a scope": (in_scope, 10),
    }
    print(f"\nper op, the backend a stub, median of 7 runs of {n} calls (microseconds)")
    print(f"{'op':<26}{'off':>9}{'on':>9}{'on - off':>10}")
    for name, (fn, ops) in cases.items():
        rows: dict[str, list[float]] = {"off": [], "on": []}
        for round_ in range(7):
            for mode in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                _switch(mode == "on", saved)
                rows[mode].append(_per_op(fn, n // ops) / ops)
        off, on = statistics.median(rows["off"]), statistics.median(rows["on"])
        print(f"{name:<26}{off:>9.2f}{on:>9.2f}{on - off:>10.2f}")
    _switch(True, saved)
    dist.destroy_process_group()


def _spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _spin_control(t: torch.Tensor, n: int) -> None:
    """What any work between two back-to-back ops costs here: a busy wait of a few microseconds
    (about the recorder's own work) before each torch ``all_reduce``, or between its
    asynchronous launch and its wait (where ferrodist records). Where an op grows by several
    times the wait, "on - off" above measures the machine (the backend's thread asleep or queued
    behind the caller) more than the recorder."""
    torch_all_reduce = torch.distributed.all_reduce

    def before(us: float) -> None:
        _spin(us)
        torch_all_reduce(t)

    def between(us: float) -> None:
        work = torch_all_reduce(t, async_op=True)
        _spin(us)
        work.wait()

    print("control: torch's all_reduce with a busy wait (microseconds)")
    print(f"{'busy wait':<26}{'none':>9}{'before':>9}{'between':>9}")
    for us in (2.0, 4.0):
        plain = statistics.median(_per_op(lambda: torch_all_reduce(t), n) for _ in range(3))
        pre = statistics.median(_per_op(lambda us=us: before(us), n) for _ in range(3))
        mid = statistics.median(_per_op(lambda us=us: between(us), n) for _ in range(3))
        print(f"{us:<26.1f}{plain:>9.1f}{pre:>9.1f}{mid:>9.1f}")


def _profile_recorded(fn: Callable[[], Any], n: int) -> None:
    """Where a recorded op's time goes, by Python function (cProfile, recording on)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    profiler.disable()
    print(f"\nrecorded all_reduce x {n}, by own time (cProfile)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def _last_id(rec: Any) -> int:
    """The id of the newest op in the ring (ids count every op, the ring keeps the last few)."""
    entries = rec.entries() if rec is not None else []
    return int(entries[-1]["id"]) if entries else 0


def _per_op_world2(saved: Any, n: int) -> dict[str, dict[str, float]]:
    """Microseconds an op takes at world 2 (a real exchange between two processes), torch's and
    ferrodist's with recording off and on (median of 7 alternating rounds): a synchronous
    all_reduce of 1,024 floats, and an isend and irecv of 1,024 floats each way, both waited
    (a pipeline's exchange; two recorded ops, held as point-to-point works until they finish)."""
    t = torch.ones(1024)
    sent, received = torch.ones(1024), torch.empty(1024)
    peer = 1 - dist.get_rank()

    def exchange(isend: Callable[..., Any], irecv: Callable[..., Any]) -> None:
        for work in (isend(sent, peer), irecv(received, peer)):
            work.wait()

    tdist = torch.distributed
    cases: dict[str, dict[str, tuple[bool, Callable[[], Any]]]] = {
        "all_reduce": {
            "torch": (False, lambda: tdist.all_reduce(t)),
            "off": (False, lambda: dist.all_reduce(t)),
            "on": (True, lambda: dist.all_reduce(t)),
        },
        "isend + irecv": {
            "torch": (False, lambda: exchange(tdist.isend, tdist.irecv)),
            "off": (False, lambda: exchange(dist.isend, dist.irecv)),
            "on": (True, lambda: exchange(dist.isend, dist.irecv)),
        },
    }
    figures: dict[str, dict[str, float]] = {}
    for case, modes in cases.items():
        rows: dict[str, list[float]] = {name: [] for name in modes}
        for round_ in range(7):
            order = list(modes) if round_ % 2 == 0 else list(modes)[::-1]
            for name in order:
                on, fn = modes[name]
                _switch(on, saved)
                dist.barrier()
                rows[name].append(_per_op(fn, n))
        figures[case] = {name: statistics.median(v) for name, v in rows.items()}
    _switch(True, saved)
    return figures


def _model(args: argparse.Namespace) -> torch.nn.Module:
    """The many-tensor MLP (``--model mlp``: every op latency-bound, the recorder's worst case) or
    a stack of transformer encoder layers (``--model transformer``: a shape users train)."""
    if args.model == "transformer":
        return torch.nn.Sequential(
            *[
                torch.nn.TransformerEncoderLayer(
                    args.width, args.heads, 4 * args.width, dropout=0.0, batch_first=True
                )
                for _ in range(args.layers)
            ]
        )
    return torch.nn.Sequential(
        *[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]
    )


def _describe_model(args: argparse.Namespace) -> str:
    if args.model == "transformer":
        return (
            f"{args.layers} x TransformerEncoderLayer({args.width}, {args.heads} heads, ff "
            f"{4 * args.width}), batch {args.batch} x {args.seq} tokens"
        )
    return f"{args.layers} x Linear({args.width}, {args.width}), batch {args.batch}"


def _recorder_work_us(saved: Any, n: int = 20000) -> float:
    """Microseconds of the recorder's own calls for one synchronous op on a CPU tensor (describe
    and record it, mark it started and completed), timed alone: what recording adds to a step
    when nothing else it causes (where it sits beside the backend's thread) is counted."""
    t = torch.ones(4)
    _switch(True, saved)

    def one() -> None:
        ident = _recorder.begin("all_reduce", "WORLD", (t,), torch.distributed.ReduceOp.SUM)
        _recorder.started(ident)
        _recorder.wait_launched(ident, None, on_device=False)

    return statistics.median(_per_op(one, n) for _ in range(5))


def _bootstrap_median(values: list[float], draws: int = 4000) -> tuple[float, float]:
    """A 95 % interval for the median of ``values`` (percentile bootstrap, fixed seed)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def _worker(rank: int, port: int, args: argparse.Namespace, out: Any) -> None:
    torch.set_num_threads(1)
    if args.pin:  # this rank and every thread it starts (gloo's) on one core of its own
        os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_flush_denormal(True)  # deep MLPs decay into subnormals: benches/README.md
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=120),
    )
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from ferrodist.ddp import DistributedDataParallel
    from ferrodist.fsdp import FullyShardedDataParallel

    saved = _recorder.recorder()
    per_op = {} if args.skip_per_op else _per_op_world2(saved, args.ops // 10)
    work = _recorder_work_us(saved)
    if args.per_op_only:
        if rank == 0:
            out.put(({}, {}, per_op, work))
        dist.barrier()
        dist.destroy_process_group()
        return
    torch.manual_seed(0)
    layered = _model(args)  # FSDP wraps each of its layers as a unit
    models = {
        "ddp": DistributedDataParallel(_model(args), bucket_cap_mb=args.bucket_mb),
        "fsdp": FullyShardedDataParallel(
            layered, auto_wrap_policy=ModuleWrapPolicy({type(layered[0])})
        ),
    }
    rows = (args.batch, args.seq) if args.model == "transformer" else (args.batch,)
    x = torch.randn(*rows, args.width)

    def step(model: torch.nn.Module) -> tuple[float, float]:
        """(wall seconds, this thread's CPU seconds) of one step; on CPU the backward and its
        hooks run on the calling thread, so the second is every recorder call's cost without
        the time spent waiting for the peer or for the machine."""
        dist.barrier()
        start, cpu = time.perf_counter(), time.thread_time()
        model(x).sum().backward()
        for p in model.parameters():
            p.grad = None
        return time.perf_counter() - start, time.thread_time() - cpu

    # Steps in pairs, on and off back to back, in the order on-off, off-on, ... (so neither
    # mode always follows the other); a pair's two steps see the same machine.
    pairs: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in models}
    ops_per_step: dict[str, int] = {}
    for name, model in models.items():
        _switch(True, saved)
        before = _last_id(saved)
        for _ in range(args.warmup):
            step(model)
        ops_per_step[name] = (_last_id(saved) - before) // max(args.warmup, 1)
        for i in range(args.pairs):
            timed: dict[str, tuple[float, float]] = {}
            for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
                _switch(mode == "on", saved)
                timed[mode] = step(model)
            pairs[name].append((timed["on"][0], timed["off"][0], timed["on"][1], timed["off"][1]))
    _switch(True, saved)
    if rank == 0:
        out.put((pairs, ops_per_step, per_op, work))
    dist.barrier()
    del models
    dist.destroy_process_group()


def _run_workers(args: argparse.Namespace) -> tuple[Any, Any, Any, float]:
    """One run of part 2 in two fresh processes: (pairs, ops a step, per op, own work)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, args, out)) for r in range(2)]
    for p in procs:
        p.start()
    result = out.get(timeout=3600)
    for p in procs:
        p.join(120)
    return result


def _cpu_ratio(pairs: list[tuple[float, float, float, float]]) -> float:
    """The median of a run's on / off ratios of the stepping thread's CPU time."""
    return statistics.median(p[2] / p[3] for p in pairs)


def part2(args: argparse.Namespace) -> None:
    if args.runs > 1:
        _part2_runs(args)
        return
    pairs, ops, per_op, work = _run_workers(args)
    if per_op:
        print(
            "\nper op, world 2, gloo, 1,024 floats (a synchronous all_reduce; an isend and an "
            "irecv each way, waited), median of 7 rounds, microseconds"
        )
        print(f"{'op':<16}{'torch':>9}{'off':>9}{'on':>9}{'on - off':>10}")
        for case, f in per_op.items():
            print(
                f"{case:<16}{f['torch']:>9.1f}{f['off']:>9.1f}{f['on']:>9.1f}"
                f"{f['on'] - f['off']:>10.1f}"
            )
    print(f"\nthe recorder's own calls for one op, timed alone: {work:.2f} us")
    if args.per_op_only:
        return
    print(
        f"\nstep time, world 2, gloo, {_describe_model(args)}, "
        f"{args.pairs} pairs of steps (one on, one off, back to back; medians, ms)"
        + (", each rank pinned to a core" if args.pin else "")
    )
    print(
        f"{'model':<6}{'ops/step':>9}{'time':>6}{'off':>9}{'on':>9}{'on / off':>10}"
        f"{'95 % interval':>17}{'own work':>10}{'us / op':>9}"
    )
    for name in ("ddp", "fsdp"):
        for kind, on_at, off_at in (("wall", 0, 1), ("cpu", 2, 3)):
            on = [p[on_at] for p in pairs[name]]
            off = [p[off_at] for p in pairs[name]]
            ratios = [a / b for a, b in zip(on, off)]
            low, high = _bootstrap_median(ratios)
            own = ops[name] * work * 1e-6 / statistics.median(off)
            per_op = (statistics.median(ratios) - 1) * statistics.median(off) / ops[name] * 1e6
            print(
                f"{name:<6}{ops[name]:>9}{kind:>6}{statistics.median(off) * 1e3:>9.2f}"
                f"{statistics.median(on) * 1e3:>9.2f}{statistics.median(ratios):>10.4f}"
                f"{f'{low:.4f}-{high:.4f}':>17}{own:>10.2%}{per_op:>9.1f}"
            )
    print(
        "on / off: the median of the pairs' ratios; wall: the step's time; cpu: the stepping "
        "thread's CPU time (what the recorder's calls cost it, without waits); own work: "
        "ops/step x the recorder's own calls / the step off; us / op: (on / off - 1) x the step "
        "off / ops a step, what one op recorded costs the step in place"
    )


def _part2_runs(args: argparse.Namespace) -> None:
    """``--runs K``: part 2's steps in K runs, each in fresh processes. Each process lays out
    its memory anew (addresses, heap, the interpreter's objects), and on this small machine a
    run's on / off ratio moves by about 2 % with it, more than one run's interval says; the
    mean over runs of each run's median ratio is the estimate, with a t interval over runs."""
    args = argparse.Namespace(**{**vars(args), "skip_per_op": True})
    ratios: dict[str, list[float]] = {"ddp": [], "fsdp": []}
    ops: dict[str, int] = {}
    for run in range(args.runs):
        pairs, ops, _, _ = _run_workers(args)
        for name in ratios:
            ratios[name].append(_cpu_ratio(pairs[name]))
        print(
            f"run {run + 1}: stepping thread's CPU on / off, "
            + ", ".join(f"{name} {values[-1]:.4f}" for name, values in ratios.items()),
            flush=True,
        )
    print(
        f"\nstep time, world 2, gloo, {_describe_model(args)}: {args.runs} runs of "
        f"{args.pairs} pairs" + (", each rank pinned to a core" if args.pin else "")
    )
    print(f"{'model':<6}{'ops/step':>9}{'mean on / off':>15}{'95 % interval':>17}{'runs':>29}")
    for name, values in ratios.items():
        mean = statistics.fmean(values)
        t = _T95[min(len(values) - 1, len(_T95)) - 1]
        half = t * statistics.stdev(values) / len(values) ** 0.5
        spread = f"{min(values):.4f}-{max(values):.4f}"
        print(
            f"{name:<6}{ops[name]:>9}{mean:>15.4f}"
            f"{f'{mean - half:.4f}-{mean + half:.4f}':>17}{spread:>29}"
        )
    print(
        "mean on / off: the mean over runs of each run's median ratio of the stepping thread's "
        "CPU time; 95 % interval: Student's t over runs; runs: the lowest and highest run"
    )


# Student's t, 97.5th percentile, for 1 to 12 degrees of freedom (then 12's, a little wide).
_T95 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    parser.add_argument("--heads", type=int, default=8, help="attention heads (transformer)")
    parser.add_argument("--batch", type=int, default=16, help="rows (mlp) or sequences a step")
    parser.add_argument("--seq", type=int, default=128, help="tokens a sequence (transformer)")
    parser.add_argument("--bucket-mb", type=float, default=0.05)
    parser.add_argument("--pairs", type=int, default=100, help="pairs of steps per model")
    parser.add_argument(
        "--runs", type=int, default=1, help="part 2's steps in this many runs, fresh processes each"
    )
    parser.add_argument("--warmup", type=int, default=3, help="steps before the pairs")
    parser.add_argument("--skip-per-op", action="store_true")
    parser.add_argument(
        "--per-op-only", action="store_true", help="the per-op figures (world 1 and 2), no steps"
    )
    parser.add_argument(
        "--stub-only", action="store_true", help="part 1's figures, the stub rows included, only"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="each rank, with its backend's threads, on a core of its own (as on two hosts)",
    )
    parser.add_argument(
        "--cuda", action="store_true", help="part 1 only, on NCCL with CUDA tensors (world 1)"
    )
    args = parser.parse_args()
    if args.cuda:
        part1(args.ops, cuda=True)
        return
    if not args.skip_per_op:
        part1(args.ops)
        stub_rows(args.ops * 5)
    if args.stub_only:
        return
    part2(args)


if __name__ == "__main__":
    main()
