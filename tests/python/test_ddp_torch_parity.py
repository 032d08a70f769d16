"""ferrodist's DDP against torch's own DDP, step by step, in a gloo world of two processes.

``skip_all_reduce_unused_params`` (buckets whose parameters a rank left unused are not
reduced, with and without a comm hook, bucket views, a static graph) and sparse gradients with
``gradient_as_bucket_view`` (torch's test_sparse_gradients_grad_is_view, through a comm hook
too, mixed with dense buckets, accumulating). The scenarios live in
_ddp_torch_parity_worker.py; each asserts that gradients and parameters are bitwise torch's
after every step, and that the Logger counts the same reduced buckets. torch's side of the
sparse scenarios trains in a world that never loads ferrodist (``_torch_only_world``).
"""

from __future__ import annotations

import inspect
import pickle

import pytest
import torch
from _ddp_torch_parity_worker import SCENARIOS, TORCH_TRACES_ENV
from _scenario_world import scenario_results
from _torch_only_world import torch_only_results

WORLD = 2
# torch added the argument after 2.4; there is no torch DDP to compare those scenarios with.
TORCH_SKIPS_UNUSED = (
    "skip_all_reduce_unused_params"
    in inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Run every scenario once in one world; ``{scenario: [outcome per rank]}``. torch's side
    of the sparse scenarios trains first, in a world without ferrodist."""
    traces = torch_only_results("_ddp_torch_parity_worker", "torch_sparse_traces", WORLD)
    path = tmp_path_factory.mktemp("torch-sparse") / "traces.pickle"
    path.write_bytes(pickle.dumps(traces))
    with pytest.MonkeyPatch.context() as env:
        env.setenv(TORCH_TRACES_ENV, str(path))  # the scenario world's processes inherit it
        return scenario_results("_ddp_torch_parity_worker", list(SCENARIOS), WORLD)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_matches_torch_ddp_bitwise(results: dict[str, list[str]], scenario: str) -> None:
    if scenario.startswith("skip_") and not TORCH_SKIPS_UNUSED:
        pytest.skip(f"torch {torch.__version__} has no skip_all_reduce_unused_params")
    assert results[scenario] == ["PASS"] * WORLD, results[scenario]
