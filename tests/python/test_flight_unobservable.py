"""Works whose completion cannot be polled: gloo's reduce-scatters return a work without a future
whose ``is_completed`` stays False after ``wait`` (torch 2.4 to 2.15). The recorder must not
leave such an op pending forever (the watchdog would report a hang that is not there), and must
still show it pending while nothing after it has completed."""

from __future__ import annotations

import json
import socket

from _procs import outputs_of, spawn

_WORKER = """
import json, sys, torch, ferrodist as dist, ferrodist.debug, ferrodist.debug._recorder
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
rec = ferrodist.debug.recorder()
x, out = torch.ones(4), torch.empty(2)
work = dist.reduce_scatter_tensor(out, x, async_op=True)
work.wait()
print("AFTER_WAIT", rec.entries()[-1]["op"], rec.entries()[-1]["state"], flush=True)
dist.all_reduce(torch.ones(1))  # a later op completes: the reduce-scatter did before it
ferrodist.debug._recorder.sweep()  # what the watchdog and dumps do before they read the ring
states = {e["op"]: e["state"] for e in rec.entries()}
print("STATES", json.dumps(states), flush=True)
print("RESULT", out.tolist(), flush=True)
dist.destroy_process_group()
"""


def test_an_unpollable_reduce_scatter_completes_once_a_later_op_has() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    outputs = outputs_of([spawn(_WORKER, str(rank), port) for rank in range(2)], timeout=120)
    for out in outputs:
        # waited for, but nothing says so: still pending (a hang here would be reported)
        assert "AFTER_WAIT reduce_scatter_tensor started" in out, out
        line = next(x for x in out.splitlines() if x.startswith("STATES "))
        states = json.loads(line.split(" ", 1)[1])
        assert states["reduce_scatter_tensor"] == "completed", out
        assert "RESULT [2.0, 2.0]" in out, out
