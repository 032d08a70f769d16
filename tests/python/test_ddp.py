"""ferrodist's DDP against torch's DDP, in real gloo process groups.

One spawned world of three processes (three, so the division by the world size is not a power
of two and a wrong reduction order would show) runs every scenario of ``_ddp_scenarios`` on
both DDPs from the same seed and data; the tests below assert on what each rank reported:
parameters bitwise equal to torch's (the same buckets reduced the same way), the same bucket
layout handed to comm hooks before and after the rebuild, and the errors naming their culprits.
The sparse scenarios' torch side runs in a second world that never loads ferrodist
(``_torch_only_world``): torch's gloo sparse all-reduce corrupts the heap now and then beside
any Rust extension, and ferrodist's DDP sums sparse gradients without it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import _ddp_scenarios
import pytest
import torch
import torch.multiprocessing as mp
from _torch_only_world import torch_only_results

WORLD = 3
HERE = os.path.dirname(__file__)


def _worker(rank: int, world: int, port: int, queue: Any) -> None:
    sys.path.insert(0, HERE)
    import _ddp_scenarios
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        queue.put((rank, _ddp_scenarios.run_all()))
    except BaseException as e:
        queue.put((rank, {"exception": repr(e)}))
        raise
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def reports(free_port: int) -> dict[int, dict[str, Any]]:
    """Run the scenario world once for the whole module; ``{rank: report}``."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=_worker, args=(r, WORLD, free_port, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        out: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + 240
        while len(out) < WORLD:
            # A worker that dies (a signal, a crash in native code) never reports: say which,
            # and how, at once instead of waiting out the test's timeout.
            if not queue.empty():
                rank, report = queue.get()
                out[rank] = report
                continue
            dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            assert not dead, f"DDP workers died before reporting (rank, exit code): {dead}"
            missing = sorted(set(range(WORLD)) - set(out))
            assert time.monotonic() < deadline, f"no report from ranks {missing}"
            time.sleep(0.05)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    # The sparse scenarios' torch side, from a world that never loads ferrodist (see
    # _ddp_scenarios and _torch_only_world), compared with ferrodist's side from this one.
    torch_sides = torch_only_results("_ddp_scenarios", "torch_sparse_sides", WORLD)
    for rank, report in out.items():
        if "sparse_sides" in report:
            ours = report.pop("sparse_sides")
            report.update(_ddp_scenarios.compare_sparse(ours, torch_sides[rank]))
    return out


@pytest.fixture(scope="module")
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


BITWISE = [
    "default",
    "allreduce_hook_layout",
    "unused_find",
    "unused_everywhere",
    "tied_and_buffers",
    "no_sync",
    "bucket_view_no_sync",
    "bucket_view_unused",
    "static_graph",
    "fp16_compress",
    "fp16_wrapper_swapped",
    "sparse",
    "sparse_hook",
    "sparse_find_unused",
    "wide",
    "wide_bucket_view",
    "wide_bucket_view_zeroed_no_sync",
    "wide_hook_bucket_view",
    "wide_unused_find",
    "wide_static_graph",
    "wide_fp16",
    "bf16_unused_find",
    "delayed_all_reduce",
    "subgroup",
    "join_uneven",
    "join_uneven_dynamic_divisor",
    "fused_optimizer",
    "builtin_allreduce",
    "builtin_fp16",
    "shipped_powerSGD",
    "shipped_post_localSGD",
    "shipped_noop",
    "shipped_hook_then_optimizer",
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", BITWISE)
def test_parameters_bitwise_equal_to_torch_ddp(
    reports: dict[int, dict[str, Any]], scenario: str
) -> None:
    for rank, report in reports.items():
        assert "exception" not in report, report
        result = report[scenario]
        assert result["bitwise"], f"rank {rank}: max |diff| {result['max_diff']}"
        assert result["buffers_bitwise"], f"rank {rank}: buffers differ"


@pytest.mark.timeout(300)
def test_ranks_end_with_the_same_model(reports: dict[int, dict[str, Any]]) -> None:
    for scenario in BITWISE:
        if scenario in ("shipped_post_localSGD", "shipped_noop"):
            continue  # no (or periodic) communication: replicas differ by design
        members = [1, 2] if scenario == "subgroup" else list(range(WORLD))
        first = reports[members[0]][scenario]["ferrodist_params"]
        assert first, scenario
        for rank in members[1:]:
            assert reports[rank][scenario]["ferrodist_params"] == first, (scenario, rank)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "scenario", ["allreduce_hook_layout", "unused_find", "static_graph", "sparse_hook"]
)
def test_hooks_see_torchs_bucket_layout(reports: dict[int, dict[str, Any]], scenario: str) -> None:
    result = reports[0][scenario]
    assert result["ferrodist_layout"] == result["torch_layout"]
    assert result["rebuilt"][0] == result["rebuilt"][1]
    indices = [index for index, _, _ in result["ferrodist_layout"]]
    assert len(set(indices)) > 1, "the small bucket cap must give several buckets"


@pytest.mark.timeout(300)
def test_buckets_rebuilt_in_gradient_arrival_order(reports: dict[int, dict[str, Any]]) -> None:
    layout = reports[0]["allreduce_hook_layout"]["ferrodist_layout"]
    first_iteration = next(entry for entry in layout if entry[0] == 0)
    # iteration 1: one bucket in registration order; afterwards bucket 0 holds the last layer
    assert first_iteration[2][0] == "inp.weight" and first_iteration[1] is True
    rebuilt_first = next(entry for entry in layout[1:] if entry[0] == 0)[2]
    assert rebuilt_first[0].startswith("out."), rebuilt_first


@pytest.mark.timeout(300)
def test_fp16_compression_within_tolerance(reports: dict[int, dict[str, Any]]) -> None:
    exact = reports[0]["default"]["ferrodist_params"]
    compressed = reports[0]["fp16_compress"]["ferrodist_params"]
    for name, values in exact.items():
        diff = (torch.tensor(values) - torch.tensor(compressed[name])).abs().max().item()
        assert diff < 1e-3, (name, diff)


@pytest.mark.timeout(300)
def test_mismatched_models_name_the_parameter_and_ranks(
    reports: dict[int, dict[str, Any]],
) -> None:
    for report in reports.values():
        text = report["mismatch_error"]
        assert "'1.weight'" in text and "rank 0" in text and "rank 1" in text, text
        assert "[3, 4]" in text and "[4, 4]" in text


@pytest.mark.timeout(300)
def test_unused_parameter_without_detection_is_explained(
    reports: dict[int, dict[str, Any]],
) -> None:
    text = reports[0]["unused_error"]
    assert text.startswith("Expected to have finished reduction in the prior iteration")
    assert "find_unused_parameters=True" in text and "spare.weight" in text
