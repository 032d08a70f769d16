"""The flight recorder in working jobs: ferrodist's ops, DDP and ZeRO traffic recorded and tagged,
no false report in a clean run, dumps read back by the doctor, recording off, fork, exit."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest
from _procs import env, outputs_of
from test_flight_hang import site, start_world, values

import ferrodist.doctor


def run_python(code: str, extra: dict[str, str] | None = None, timeout: float = 60) -> str:
    environ = env()
    environ.update(extra or {})
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_a_clean_ddp_and_zero_run_with_uneven_steps_reports_nothing(tmp_path):
    outputs = outputs_of(start_world("ddp_clean", 2, tmp_path), timeout=240)
    for out in outputs:
        assert "DONE ddp_clean" in out, out
        assert not values(out, "FALSE_REPORT"), out
        assert "a collective is stuck" not in out, out
        ops = json.loads(values(out, "OPS")[0])
        # DDP's bucket all-reduces (several buckets per step) and ZeRO's broadcasts, tagged
        assert ops.get("ddp.all_reduce", 0) >= 150, ops
        assert ops.get("zero.broadcast", 0) >= 100, ops
        assert json.loads(values(out, "PENDING")[0]) == [], out


def test_a_receive_from_any_source_moves_to_its_senders_channel(tmp_path):
    """Pending, it waits on its rank's own channel at the user's line; once its sender is known
    it takes its place in the sender's channel, so the numbering on both ends stays aligned."""
    outputs = outputs_of(start_world("p2p_any", 3, tmp_path), timeout=120)
    for out in outputs:
        assert "DONE p2p_any" in out, out
    receiver = outputs[1]
    assert json.loads(values(receiver, "SENDER")[0]) == 0
    waiting = json.loads(values(receiver, "WAITING")[0])
    assert [(e["group"], e["op"], e["state"]) for e in waiting] == [
        ("WORLD:p2p:any->1", "p2p any->1", "started")
    ], waiting
    assert waiting[0]["call_site"] == site("any_irecv")
    rings = [
        [e for e in json.loads(values(out, "ENTRIES")[0]) if "p2p" in e["group"]] for out in outputs
    ]
    signatures = [[(e["group"], e["seq"], e["op"], e["shapes"]) for e in r] for r in rings]
    assert signatures[0] == [
        ("WORLD:p2p:0->1", 1, "p2p 0->1", [[3]]),
        ("WORLD:p2p:0->1", 2, "p2p 0->1", [[3]]),
    ]
    assert signatures[2] == [("WORLD:p2p:2->1", 1, "p2p 2->1", [[3]])]
    # the receiver's ring: the same (channel, seq, op, shapes), in its own issue order
    assert sorted(signatures[1]) == sorted(signatures[0] + signatures[2]), signatures[1]
    assert all(e["state"] == "completed" for r in rings for e in r), rings


def test_fsdp_traffic_is_recorded_as_fsdp(tmp_path):
    outputs = outputs_of(start_world("fsdp", 2, tmp_path), timeout=240)
    for out in outputs:
        assert "DONE fsdp" in out, out
        ops = json.loads(values(out, "OPS")[0])
        assert {"fsdp.all_gather", "fsdp.reduce_scatter"} <= set(ops), ops
        assert json.loads(values(out, "PENDING")[0]) == [], out


def test_point_to_point_ops_share_a_channel_and_a_name_on_both_ends(tmp_path):
    """A channel per direction: transfers 0->1 and 1->0 issued in opposite orders on the two
    ranks (the batch below) are not a desync."""
    outputs = outputs_of(start_world("p2p", 2, tmp_path), timeout=120)
    rings = []
    for out in outputs:
        assert "DONE p2p" in out, out
        rings.append([e for e in json.loads(values(out, "ENTRIES")[0]) if "p2p" in e["group"]])
    signatures = [[(e["group"], e["seq"], e["op"], e["shapes"]) for e in r] for r in rings]
    assert (
        signatures[0][:2]
        == signatures[1][:2]
        == [
            ("WORLD:p2p:0->1", 1, "p2p 0->1", [[3]]),
            ("WORLD:p2p:0->1", 2, "p2p 0->1", [[3]]),
        ]
    )
    # the batch built with ferrodist.isend / irecv went through torch's batch_isend_irecv
    assert {e["op"] for e in rings[0][2:]} == {"p2p 0->1", "p2p 1->0"}
    # each rank sent, then received, in the batch: every (channel, seq) is one op on both ends
    by_seq = [{(e["group"], e["seq"]): (e["op"], e["shapes"]) for e in r} for r in rings]
    assert by_seq[0] == by_seq[1], by_seq
    assert all(e["state"] == "completed" for r in rings for e in r), rings
    assert json.loads(values(outputs[1], "RESULT")[0]) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("as_json", [False, True])
def test_dump_writes_each_rank_and_the_doctor_finds_no_hang(tmp_path, as_json):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    saved = dict(os.environ)
    os.environ["FLIGHT_TEST_DIR"] = str(dumps)
    try:
        outputs = outputs_of(start_world("dump", 2, tmp_path), timeout=120)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    for out in outputs:
        assert "DONE dump" in out, out
    assert sorted(p.name for p in dumps.iterdir()) == ["rank0.json", "rank1.json"]
    dumped = json.loads((dumps / "rank1.json").read_text())
    assert (dumped["rank"], dumped["world_size"], dumped["reason"]) == (1, 2, "manual")
    sites = [e["call_site"] for e in dumped["entries"]]
    assert sites.count(site("dumped")) == 5, sites
    args = [sys.executable, "-m", "ferrodist.doctor", str(dumps)] + (["--json"] if as_json else [])
    done = subprocess.run(args, capture_output=True, text=True, env=env(), timeout=60)
    assert done.returncode == 0, done.stderr
    if as_json:
        report = json.loads(done.stdout)
        assert (report["behind"], report["desyncs"], report["gone"]) == ([], [], [])
    else:
        assert done.stdout.startswith("no hang found"), done.stdout


def test_the_doctor_names_a_rank_without_a_dump_and_refuses_an_empty_dir(tmp_path, capsys):
    assert ferrodist.doctor.main([str(tmp_path)]) == 2
    assert "no flight recorder dump" in capsys.readouterr().err
    out = run_python(
        f"""
        import ferrodist.debug, torch
        rec = ferrodist.debug.recorder()
        ident, seq = rec.record("WORLD", "all_reduce", [[2]], ["float32"], "SUM", "x.py:1")
        rec.completed(ident)
        open({str(tmp_path / "rank0.json")!r}, "w").write(rec.dump_json(0, 2, "manual"))
        """
    )
    (tmp_path / "notes.json").write_text('{"format": "something else"}')
    assert ferrodist.doctor.main([str(tmp_path)]) == 0, out
    captured = capsys.readouterr()
    assert "rank 1" in captured.out and "gone" in captured.out, captured.out
    assert "skipped notes.json" in captured.err, captured.err


def test_recording_off_leaves_ops_working_and_records_nothing():
    out = run_python(
        """
        import ferrodist as dist, ferrodist.debug, torch
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        t = torch.ones(2)
        dist.all_reduce(t)
        print("RECORDER", ferrodist.debug.recorder(), "DUMP", ferrodist.debug.dump())
        import threading
        print("THREADS", sorted(t.name for t in threading.enumerate()))
        dist.destroy_process_group()
        """,
        {"FERRODIST_FLIGHT_RECORDER": "0"},
    )
    assert "RECORDER None DUMP None" in out, out
    assert "ferrodist-flight-watchdog" not in out, out


def test_watchdog_lives_with_the_group_is_absent_after_fork_and_never_holds_exit(tmp_path):
    out = run_python(
        """
        import os, threading, ferrodist as dist, ferrodist.debug, torch
        def dogs():
            return [t for t in threading.enumerate() if t.name == "ferrodist-flight-watchdog"]
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        dist.all_reduce(torch.ones(2))
        print("WITH_GROUP", len(dogs()), dogs()[0].daemon)
        pid = os.fork()
        if pid == 0:
            ok = not dogs() and ferrodist.debug.recorder().entries() == []
            os._exit(0 if ok else 1)
        print("CHILD", os.waitpid(pid, 0)[1])
        with ferrodist.debug.record_op("my.op", None, [torch.ones(3)], "MAX") as op:
            pass
        print("RECORDED", ferrodist.debug.recorder().entries()[-1]["op"])
        dist.destroy_process_group()
        print("AFTER_DESTROY", len(dogs()))
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        print("AGAIN", len(dogs()))
        # no destroy: exit must neither hang on the thread nor abort
        """,
        {"FERRODIST_FLIGHT_DUMP_DIR": str(tmp_path)},
    )
    assert "WITH_GROUP 1 True" in out, out
    assert "CHILD 0" in out, out
    assert "RECORDED my.op" in out, out
    assert "AFTER_DESTROY 0" in out, out
    assert "AGAIN 1" in out, out


def test_a_default_dump_dir_planted_by_someone_else_is_refused(tmp_path):
    """Threat: another local user makes the shared temp dir's dump name first (a link to a
    directory of theirs, or their own directory) to receive, or redirect, this user's dumps."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (tmp_path / f"ferrodist-flight-{os.getuid()}").symlink_to(theirs)
    out = run_python(
        """
        import ferrodist.debug
        ferrodist.debug.recorder().record("WORLD", "all_reduce", [[1]], ["float32"], None, "x:1")
        try:
            ferrodist.debug.dump()
        except PermissionError as e:
            print("REFUSED", e)
        """,
        {"TMPDIR": str(tmp_path), "FERRODIST_FLIGHT_DUMP_DIR": ""},
    )
    assert "REFUSED" in out and "FERRODIST_FLIGHT_DUMP_DIR" in out, out
    assert list(theirs.iterdir()) == []
    # the default, where nobody planted anything: a private directory of this user's
    (tmp_path / f"ferrodist-flight-{os.getuid()}").unlink()
    out = run_python(
        "import ferrodist.debug; print('AT', ferrodist.debug.dump())",
        {"TMPDIR": str(tmp_path), "FERRODIST_FLIGHT_DUMP_DIR": ""},
    )
    made = tmp_path / f"ferrodist-flight-{os.getuid()}"
    assert f"AT {made / 'rank0.json'}" in out, out
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert stat.S_IMODE((made / "rank0.json").stat().st_mode) == 0o600


def test_ops_recorded_after_their_launch_keep_their_state_and_their_errors():
    """Collectives are launched first and recorded while the backend runs them: a synchronous
    op still returns None and is completed when it returns, an asynchronous one returns its
    work and completes once finished, and a launch that raises is recorded failed with torch's
    own error class."""
    out = run_python(
        """
        import json, ferrodist as dist, ferrodist.debug, torch
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        rec = ferrodist.debug.recorder()
        t = torch.ones(3)
        print("SYNC", dist.all_reduce(t))
        work = dist.broadcast(t, 0, async_op=True)
        print("ASYNC", type(work).__name__)
        work.wait()
        try:
            dist.broadcast(t, 5)
        except Exception as e:
            torch_error = type(e)
        try:
            torch.distributed.broadcast(t, 5)
        except Exception as e:
            print("SAME CLASS", type(e) is torch_error)
        dist.barrier()  # a later op: the asynchronous broadcast is swept as completed
        rows = [{k: e[k] for k in ("op", "shapes", "reduce_op", "state", "call_site", "error")}
                for e in rec.entries()]
        print("ROWS", json.dumps(rows))
        dist.destroy_process_group()
        """
    )
    assert "SYNC None" in out and "ASYNC Work" in out and "SAME CLASS True" in out, out
    rows = json.loads(out.split("ROWS ", 1)[1].splitlines()[0])
    ops = [(r["op"], r["state"]) for r in rows]
    assert ops == [
        ("all_reduce", "completed"),
        ("broadcast", "completed"),
        ("broadcast", "failed"),
        ("barrier", "completed"),
    ], rows
    assert rows[0]["shapes"] == [[3]] and rows[0]["reduce_op"] == "SUM", rows
    assert all(r["call_site"].startswith("<string>:") for r in rows), rows
    assert rows[2]["error"] and "5" in rows[2]["error"], rows


def test_ops_queued_in_a_coalescing_block_return_what_torch_returns():
    """Inside torch's coalescing block an op is only queued: torch returns None for a
    synchronous call and a placeholder work for an asynchronous one, whose ``wait`` raises. The
    recorder must not wait on or poll that placeholder, and the block's ops are recorded."""
    out = run_python(
        """
        import ferrodist as dist, ferrodist.debug, torch
        from torch.distributed.distributed_c10d import _coalescing_manager
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        a, b = torch.ones(2), torch.ones(3)
        with _coalescing_manager(async_ops=True) as cm:
            print("SYNC", dist.all_reduce(a))
            print("ASYNC", type(dist.all_reduce(b, async_op=True)).__name__)
        cm.wait()
        dist.barrier()
        print("STATES", [(e["op"], e["state"]) for e in ferrodist.debug.recorder().entries()])
        print("SUMS", a.tolist(), b.tolist())
        dist.destroy_process_group()
        """
    )
    assert "SYNC None" in out and "ASYNC _IllegalWork" in out, out
    assert (
        "STATES [('all_reduce', 'completed'), ('all_reduce', 'completed'), "
        "('barrier', 'completed')]" in out
    ), out
    assert "SUMS [1.0, 1.0] [1.0, 1.0, 1.0]" in out, out
