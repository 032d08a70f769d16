"""ferrodist.FileStore against torch's FileStore: one file, both directions, real processes."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable

import pytest
import torch.distributed as tdist
from _procs import finish, spawn

import ferrodist

# Each process: set its own key, add to a shared counter, read the other's key, wait until the
# other has counted, delete its key, then check what is left. Run with one torch and one
# ferrodist process, so each direction (torch writes / ferrodist reads and back) is exercised.
PEER = """
import sys
from datetime import timedelta
import torch.distributed as tdist
import ferrodist
impl, rank, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
other = 1 - rank
store = (tdist.FileStore if impl == "torch" else ferrodist.FileStore)(path, 2)
store.set_timeout(timedelta(seconds=30))
store.set(f"hello{rank}", f"from {impl}")
store.add("counter", 1)
store.wait([f"hello{other}"], timedelta(seconds=30))
print("got", store.get(f"hello{other}").decode())
store.set(f"counted{rank}", "1")
store.wait([f"counted{other}"])
assert int(store.get("counter")) == 2
store.set(f"read{rank}", "1")
store.wait([f"read{other}"])
assert store.delete_key(f"hello{rank}")
store.set(f"deleted{rank}", "1")
store.wait([f"deleted{other}"])
assert not store.check([f"hello{other}"])
# counter, counted0/1, read0/1, deleted0/1 and refcount/
print("num_keys", store.num_keys())
"""


@pytest.mark.timeout(120)
def test_torch_and_ferrodist_processes_rendezvous_through_one_file(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    outs = finish([spawn(PEER, "torch", "0", path), spawn(PEER, "ferrodist", "1", path)])
    assert "got from ferrodist" in outs[0]
    assert "got from torch" in outs[1]
    assert "num_keys 8" in outs[0] and "num_keys 8" in outs[1]
    # Both closed and world_size=2 instances finished: the file is gone, as torch does.
    assert not os.path.exists(path)


def _lifecycle(
    make: Callable[[str, int], tdist.Store], path: str, world_size: int, clone: bool
) -> list[bool]:
    """File existence after each step: open two instances, drop the first, drop the second."""
    seen = []
    first = make(path, world_size)
    second = first.clone() if clone else make(path, world_size)  # type: ignore[attr-defined]
    seen.append(os.path.exists(path))
    del first
    seen.append(os.path.exists(path))
    del second
    seen.append(os.path.exists(path))
    return seen


@pytest.mark.parametrize("world_size", [-1, 1, 2, 3])
@pytest.mark.parametrize("clone", [False, True])
def test_cleanup_on_last_close_matches_torch(tmp_path: Path, world_size: int, clone: bool) -> None:
    if clone and not hasattr(tdist.Store, "clone"):
        pytest.skip("this torch's stores have no clone() to compare with (torch 2.4)")
    theirs = _lifecycle(tdist.FileStore, str(tmp_path / "torch"), world_size, clone)
    ours = _lifecycle(ferrodist.FileStore, str(tmp_path / "ours"), world_size, clone)
    assert ours == theirs


def test_mixed_instances_clean_up_when_the_last_one_closes(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    theirs = tdist.FileStore(path, 2)
    ours = ferrodist.FileStore(path, 2)
    del theirs
    assert os.path.exists(path)
    del ours
    assert not os.path.exists(path)


WRITER = """
import sys
import ferrodist
store = ferrodist.FileStore(sys.argv[1])
i = 0
while True:
    store.set(f"k{i}", "v" * (i % 97) + str(i))
    print(i, flush=True)
    i += 1
"""


@pytest.mark.timeout(60)
def test_sigkilled_writer_leaves_every_acknowledged_write_readable(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    writer = spawn(WRITER, path)
    acknowledged = -1
    try:
        assert writer.stdout is not None
        while acknowledged < 300:
            line = writer.stdout.readline()
            assert line, "writer died early"
            acknowledged = int(line)
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    for make in (ferrodist.FileStore, tdist.FileStore):
        store = make(path, -1)
        for i in range(acknowledged + 1):
            assert store.get(f"k{i}") == ("v" * (i % 97) + str(i)).encode()
        del store


@pytest.mark.parametrize(
    "content",
    [os.urandom(257), b"\x05\x00\x00\x00/ab", b"\xff\xff\xff\xff/" + b"x" * 100],
    ids=["random-bytes", "truncated-record", "huge-length"],
)
def test_a_file_that_is_not_a_store_is_a_dist_store_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "not-a-store"
    path.write_bytes(content)
    start = time.monotonic()
    with pytest.raises(tdist.DistStoreError, match="not-a-store"):
        ferrodist.FileStore(str(path))
    assert time.monotonic() - start < 5


def test_timeouts_name_the_missing_keys_and_the_timeout(tmp_path: Path) -> None:
    store = ferrodist.FileStore(str(tmp_path / "store"))
    store.set("present", "1")
    with pytest.raises(tdist.DistStoreError) as info:
        store.wait(["present", "absent"], timedelta(milliseconds=100))
    assert "absent" in str(info.value) and "present" not in str(info.value)
    assert "100ms" in str(info.value)
    store.set_timeout(timedelta(milliseconds=50))
    with pytest.raises(tdist.DistStoreError, match=r"get timeout after 50ms, keys: \{nope\}"):
        store.get("nope")


def test_values_go_in_as_str_or_bytes_and_come_back_as_bytes(tmp_path: Path) -> None:
    store = ferrodist.FileStore(str(tmp_path / "store"))
    store.set("s", "text")
    store.set("b", b"\x00\xff")
    assert store.get("s") == b"text" and store.get("b") == b"\x00\xff"
    assert store.compare_set("s", "text", b"new") == b"new"
    store.append("s", "+")
    assert store.multi_get(["s", "b"]) == [b"new+", b"\x00\xff"]
    assert store.path == str(tmp_path / "store")
    assert not store.has_extended_api()
    with pytest.raises(NotImplementedError):
        store.queue_push("q", "v")


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda p: ferrodist.FileStore(1), "file_name"),
        (lambda p: ferrodist.FileStore(p, "2"), "world_size"),
        (lambda p: ferrodist.FileStore(p).set("k", 3), "value"),
        (lambda p: ferrodist.FileStore(p).add("k", "x"), "amount"),
        (lambda p: ferrodist.FileStore(p).wait("k"), "keys"),
    ],
)
def test_wrong_argument_types_are_type_errors_naming_the_argument(
    tmp_path: Path, call: Callable[[str], object], argument: str
) -> None:
    with pytest.raises(TypeError) as info:
        call(str(tmp_path / "store"))
    shown = str(info.value) + " ".join(getattr(info.value, "__notes__", []))
    assert argument in shown


def test_an_unopenable_path_is_a_dist_store_error_at_once(tmp_path: Path) -> None:
    # torch's FileStore retries such a path until its 300 s timeout.
    path = str(tmp_path / "no-such-dir" / "store")
    start = time.monotonic()
    with pytest.raises(tdist.DistStoreError, match="no-such-dir"):
        ferrodist.FileStore(path)
    assert time.monotonic() - start < 5


def test_a_store_file_replaced_by_a_directory_fails_wait_at_once_not_as_a_timeout(
    tmp_path: Path,
) -> None:
    # torch raises DistStoreError "Is a directory" here too; it was reported as a wait timeout.
    path = tmp_path / "store"
    store = ferrodist.FileStore(str(path))
    path.unlink()
    path.mkdir()
    start = time.monotonic()
    with pytest.raises(tdist.DistStoreError, match="store") as info:
        store.wait(["k"], timedelta(seconds=5))
    assert not isinstance(info.value, TimeoutError), info.value
    assert str(path) in str(info.value) and "irectory" in str(info.value)
    assert time.monotonic() - start < 4


@pytest.mark.timeout(30)
def test_a_forked_child_uses_its_own_lock_on_the_shared_file(tmp_path: Path) -> None:
    store = ferrodist.FileStore(str(tmp_path / "store"))
    store.set("before", "1")
    pid = os.fork()
    if pid == 0:  # child: reopens the file (a shared descriptor would share the flock)
        try:
            for _ in range(200):
                store.add("counter", 1)
            store.set("child", str(store.get("before"), "ascii"))
        finally:
            os._exit(0)
    for _ in range(200):
        store.add("counter", 1)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert store.get("child") == b"1"
    assert store.get("counter") == b"400"
