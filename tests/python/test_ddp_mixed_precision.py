"""DDP's ``mixed_precision`` (torch's ``_MixedPrecision``) on gloo with two real processes.

torch's own implementation needs CUDA (the GPU parity test is in test_ddp_gpu.py), so here each
rank checks ferrodist's DDP bitwise against the documented arithmetic done by hand on a plain
copy of the model (see _ddp_mp_worker.py): losses, full-precision gradients, the state after
several optimizer steps, buffers, ``no_sync`` accumulation, unused parameters and the errors.
"""

from __future__ import annotations

import os
import socket

import pytest
from _ddp_mp_worker import SCENARIOS
from _procs import finish, spawn

WORLD = 2
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def results() -> dict[str, list[str]]:
    """Run every scenario once in one world; ``{scenario: [outcome per rank]}``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = f"import sys; sys.path.insert(0, {HERE!r}); import _ddp_mp_worker as w; " + (
        "w.main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))"
    )
    procs = [spawn(code, str(r), str(WORLD), str(port)) for r in range(WORLD)]
    outputs = finish(procs, timeout=180)
    out: dict[str, list[str]] = {name: [] for name in SCENARIOS}
    for text in outputs:
        for line in text.splitlines():
            if line.startswith("RESULT "):
                _, name, outcome = line.split(" ", 2)
                out[name].append(outcome)
    return out


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_mixed_precision_scenario(results: dict[str, list[str]], scenario: str) -> None:
    assert results[scenario] == ["PASS"] * WORLD, results[scenario]
