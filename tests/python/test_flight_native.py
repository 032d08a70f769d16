"""The native flight recorder from Python: recording, summaries and the diagnosis across
real recorder objects (one per simulated rank), dumps, and bad input refused."""

from __future__ import annotations

import json
import threading
import time

import pytest

from ferrodist import _native


def _op(rec: _native.FlightRecorder, op: str = "all_reduce", site: str = "train.py:88") -> int:
    op_id, _ = rec.record("WORLD", op, [[4, 4]], ["float32"], "SUM", site)
    return op_id


def test_record_numbers_ops_and_tracks_their_state() -> None:
    rec = _native.FlightRecorder(3)
    assert rec.capacity == 3
    assert rec.record("WORLD", "all_reduce", [[2]], ["float32"], "SUM", "a.py:1") == (1, 1)
    assert rec.record("pg1", "broadcast", [[2]], ["int64"], None, "a.py:2") == (2, 1)
    assert rec.record("WORLD", "send", [[2]], ["float32"], None, "a.py:3") == (3, 1)
    rec.started(1)
    rec.completed(1)
    rec.failed(2, "peer reset")
    rec.completed(12345)  # unknown: ignored
    entries = rec.entries()
    assert [e["id"] for e in entries] == [1, 2, 3]
    assert entries[0]["state"] == "completed"
    assert entries[0]["shapes"] == [[2]]
    assert entries[0]["reduce_op"] == "SUM"
    assert entries[0]["completed_at_ms"] >= entries[0]["issued_at_ms"]
    assert entries[1]["state"] == "failed" and entries[1]["error"] == "peer reset"
    assert entries[2]["state"] == "issued" and entries[2]["completed_at_ms"] is None
    _op(rec)
    assert [e["id"] for e in rec.entries()] == [2, 3, 4]


def test_record_tensors_reads_shapes_and_dtypes_as_torch_names_them() -> None:
    torch = pytest.importorskip("torch")
    rec = _native.FlightRecorder(8)
    tensors = [
        torch.ones(2, 3),
        torch.zeros(4, dtype=torch.int64),
        torch.ones((), dtype=torch.bfloat16),
    ]
    first = rec.record_tensors("WORLD", "all_gather", tensors, "SUM", True, "a.py:1", False)
    second = rec.record_tensors("WORLD", "all_gather", tuple(tensors), None, False, "a.py:2", True)
    none = rec.record_tensors("pg1", "barrier", [], None, True, "a.py:3", False)
    assert (first, second, none) == (1, 2, 3)
    entries = rec.entries()
    assert entries[0]["shapes"] == [[2, 3], [4], []]
    assert entries[0]["dtypes"] == ["float32", "int64", "bfloat16"]
    assert entries[0]["reduce_op"] == "SUM" and entries[0]["state"] == "issued"
    assert entries[0]["seq"] == 1 and entries[1]["seq"] == 2 and entries[2]["seq"] == 1
    assert entries[1]["shapes"] == [[], [], []]  # with_shapes=False: dtypes only
    assert entries[1]["dtypes"] == entries[0]["dtypes"]
    assert entries[1]["state"] == "started" and entries[1]["started_at_ms"] is not None
    assert entries[2]["shapes"] == [] and entries[2]["dtypes"] == []
    # the same names as str(dtype) gives
    for dtype in (torch.float16, torch.float64, torch.uint8, torch.bool, torch.complex64):
        rec.record_tensors("WORLD", "x", [torch.empty(1, dtype=dtype)], None, True, "a.py:4", False)
        assert rec.entries()[-1]["dtypes"] == [str(dtype).removeprefix("torch.")]


def test_record_tensors_refuses_what_is_not_tensors() -> None:
    rec = _native.FlightRecorder(8)
    with pytest.raises(TypeError):
        rec.record_tensors("WORLD", "x", 5, None, True, "a.py:1", False)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        rec.record_tensors("WORLD", "x", [object()], None, True, "a.py:1", False)
    assert rec.entries() == []  # nothing half-recorded


class _FakeTensor:
    """What ``record_tensors`` reads of a tensor: a shape and a dtype object."""

    def __init__(self, shape: tuple[int, ...], dtype: object) -> None:
        self.shape = shape
        self.dtype = dtype


class _FakeDtype:
    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


def test_record_tensors_keeps_each_ops_own_shapes_where_descriptions_are_shared() -> None:
    torch = pytest.importorskip("torch")
    rec = _native.FlightRecorder(64)
    cases = [
        ([torch.ones(2, 3)], True, [[2, 3]], ["float32"]),
        ([torch.ones(3, 2)], True, [[3, 2]], ["float32"]),
        ([torch.ones(6)], True, [[6]], ["float32"]),
        ([torch.ones(6, 1)], True, [[6, 1]], ["float32"]),
        ([torch.ones(2, 3, dtype=torch.float64)], True, [[2, 3]], ["float64"]),
        ([torch.ones(2), torch.ones(3)], True, [[2], [3]], ["float32", "float32"]),
        ([torch.ones(2, 3)], False, [[]], ["float32"]),
        ([torch.ones(())], True, [[]], ["float32"]),
        ([torch.ones(2, dtype=torch.int8), torch.ones(2)], True, [[2], [2]], ["int8", "float32"]),
    ]
    for _ in range(3):  # the first round makes each description, the others share it
        for tensors, with_shapes, _, _ in cases:
            rec.record_tensors("WORLD", "all_reduce", tensors, None, with_shapes, "a.py:1", False)
    for entry, (_, _, shapes, dtypes) in zip(rec.entries(), cases * 3):
        assert (entry["shapes"], entry["dtypes"]) == (shapes, dtypes)


def test_record_tensors_names_what_outgrows_its_shared_tables() -> None:
    # Past each table's bound (4,096 strings and tensor sets, 32 dtypes) ops are still named
    # by their own values, and strings freed and made again (their addresses reused) too.
    rec = _native.FlightRecorder(5000)
    dtypes = [_FakeDtype(f"fake{i}") for i in range(40)]
    for i in range(5000):
        group = "".join(("pg", str(i)))  # a new object each time, freed after the call
        tensors = [_FakeTensor((i, 2), dtypes[i % 40])]
        rec.record_tensors(group, f"op{i % 7}", tensors, None, True, f"s.py:{i}", False)
    for i, entry in enumerate(rec.entries()):
        assert entry["group"] == f"pg{i}" and entry["op"] == f"op{i % 7}"
        assert entry["shapes"] == [[i, 2]] and entry["dtypes"] == [f"fake{i % 40}"]
        assert entry["call_site"] == f"s.py:{i}"


class _SlowDtype(_FakeDtype):
    """A dtype whose name lets other threads run while it is made (``str`` releases the GIL)."""

    def __str__(self) -> str:
        time.sleep(0.05)
        return super().__str__()


def test_naming_a_dtype_the_full_table_cannot_hold_lets_other_threads_record() -> None:
    # A binding that named it under its lock deadlocked here: the other thread waited for the
    # lock holding the GIL, which the namer needed back. That blocks the whole process (no
    # timeout can run without the GIL), so a regression shows as this test hanging.
    rec = _native.FlightRecorder(1000)
    tabled = [_FakeDtype(f"fake{i}") for i in range(32)]
    for dtype in tabled:  # fill the table of dtypes
        rec.record_tensors("WORLD", "x", [_FakeTensor((1,), dtype)], None, True, "a.py:1", False)
    slow = _SlowDtype("slow")
    stop = threading.Event()

    def record_slow() -> None:
        for _ in range(3):
            tensors = [_FakeTensor((2,), slow)]
            rec.record_tensors("WORLD", "y", tensors, None, True, "a.py:2", False)
        stop.set()

    def record_others() -> None:
        while not stop.is_set():
            tensors = [_FakeTensor((3,), tabled[0])]
            rec.record_tensors("WORLD", "z", tensors, None, True, "a.py:3", False)

    threads = [threading.Thread(target=f, daemon=True) for f in (record_slow, record_others)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a thread is stuck (a lock held across Python)"
    named = {e["op"]: e["dtypes"] for e in rec.entries()}
    assert named["y"] == ["slow"] and named["z"] == ["fake0"]


def test_records_from_many_threads_get_unique_ids() -> None:
    rec = _native.FlightRecorder(10_000)

    def work() -> None:
        for _ in range(500):
            rec.completed(_op(rec))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = rec.entries()
    assert [e["seq"] for e in entries] == list(range(1, 2001))
    assert all(e["state"] == "completed" for e in entries)


def test_diagnose_names_the_rank_behind() -> None:
    ranks = [_native.FlightRecorder(64) for _ in range(4)]
    for i, rec in enumerate(ranks):
        for _ in range(5):
            rec.completed(_op(rec))
        if i != 2:
            _op(rec)
    text, report_json = _native.flight_diagnose(
        [rec.summary_json(i) for i, rec in enumerate(ranks)], 4, 60.0
    )
    assert text.startswith("all_reduce #6 on WORLD: ranks 0-1 and 3 wait in it"), text
    assert "rank 2 last completed #5 (all_reduce at train.py:88)" in text, text
    report = json.loads(report_json)
    assert report["behind"][0]["ranks"][0]["rank"] == 2
    assert report["desyncs"] == [] and report["gone"] == []


def test_diagnose_names_a_desync_and_a_missing_rank() -> None:
    a, b = _native.FlightRecorder(8), _native.FlightRecorder(8)
    a.record("WORLD", "all_reduce", [[4]], ["float32"], "SUM", "a.py:10")
    b.record("WORLD", "broadcast", [[4]], ["float32"], None, "a.py:12")
    text, report_json = _native.flight_diagnose([a.summary_json(0), b.summary_json(1)], 3, 60.0)
    assert (
        "desync at #1 on WORLD: rank 0 all_reduce [[4]] float32 SUM at a.py:10, "
        "rank 1 broadcast [[4]] float32 at a.py:12"
    ) in text
    assert "rank 2 is gone: no summary published" in text
    assert [g["rank"] for g in json.loads(report_json)["gone"]] == [2]


def test_a_clean_job_and_an_infinite_heartbeat_timeout() -> None:
    ranks = [_native.FlightRecorder(8) for _ in range(2)]
    for rec in ranks:
        rec.completed(_op(rec))
    text, _ = _native.flight_diagnose(
        [r.summary_json(i) for i, r in enumerate(ranks)], 2, float("inf")
    )
    assert text == "no hang found: all 2 ranks report, none is behind or out of step"


def test_a_dump_is_versioned_and_summarised() -> None:
    rec = _native.FlightRecorder(8)
    rec.completed(_op(rec))
    _op(rec)
    dump = json.loads(rec.dump_json(1, 2, "SIGUSR1"))
    assert dump["format"] == "ferrodist-flight-recorder" and dump["version"] == 1
    assert (dump["rank"], dump["world_size"], dump["reason"]) == (1, 2, "SIGUSR1")
    assert [e["state"] for e in dump["entries"]] == ["completed", "issued"]
    summary = json.loads(_native.flight_summary_from_dump(json.dumps(dump)))
    assert summary["rank"] == 1 and summary["heartbeat_ms"] == dump["dumped_at_ms"]
    assert [e["seq"] for e in summary["pending"]] == [2]


def test_bad_input_is_refused_with_a_value_error() -> None:
    rec = _native.FlightRecorder(8)
    dump = json.loads(rec.dump_json(0, 1, "manual"))
    dump["version"] = 99
    with pytest.raises(ValueError, match="version 99 is not supported"):
        _native.flight_summary_from_dump(json.dumps(dump))
    with pytest.raises(ValueError, match="format"):
        _native.flight_summary_from_dump('{"rank": 0}')
    with pytest.raises(ValueError, match="summary"):
        _native.flight_diagnose(["{}"], 1, 1.0)
    with pytest.raises(ValueError, match="heartbeat_timeout_s"):
        _native.flight_diagnose([], 1, -1.0)
    with pytest.raises(TypeError):
        rec.record("WORLD", "all_reduce", [["x"]], ["float32"], None, "a.py:1")  # type: ignore[list-item]


def test_reduce_op_names_are_the_ops_own_on_every_call():
    # named once, then read back by the op object's identity: the same name every time, and
    # never another op's
    import torch.distributed as tdist

    from ferrodist.debug._describe import reduce_op_name

    kinds = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
    for _ in range(3):
        for kind in kinds:
            assert reduce_op_name(getattr(tdist.ReduceOp, kind)) == kind
    assert reduce_op_name(tdist.ReduceOp(tdist.ReduceOp.MAX)) == "MAX"
    assert reduce_op_name("SUM") == "SUM" and reduce_op_name(None) is None
