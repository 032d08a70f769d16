"""torch takes ferrodist's stores: process groups, torch's PrefixStore, new_group, Ctrl-C."""

from __future__ import annotations

import gc
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as tdist
from _procs import finish, spawn

import ferrodist

# Rank script. The store is built inline and not kept, the shape that used to break new_group
# (torch issue #120843: torch kept only the C++ half of a Python store subclass).
RANK = """
import gc, sys
import torch, torch.distributed as dist
import ferrodist
rank, path = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", store=ferrodist.FileStore(path, 2), rank=rank, world_size=2)
gc.collect()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print("all_reduce", t.item())
group = dist.new_group([0, 1])
t = torch.tensor([10.0 * (rank + 1)])
dist.all_reduce(t, group=group)
print("new_group all_reduce", t.item())
objs = [None, None]
dist.all_gather_object(objs, {"rank": rank}, group=group)
print("gathered", [o["rank"] for o in objs])
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_gloo_process_group_over_a_ferrodist_file_store_and_new_group(tmp_path: Path) -> None:
    path = str(tmp_path / "rdzv")
    outs = finish([spawn(RANK, str(rank), path) for rank in (0, 1)])
    for out in outs:
        assert "all_reduce 3.0" in out
        assert "new_group all_reduce 30.0" in out
        assert "gathered [0, 1]" in out


def test_torch_prefix_store_over_a_ferrodist_store_outlives_the_python_reference() -> None:
    prefixed = tdist.PrefixStore("p", ferrodist.HashStore())
    gc.collect()
    prefixed.set("k", "v")
    assert prefixed.get("k") == b"v"
    assert prefixed.add("n", 2) == 2
    prefixed.wait(["k"], timedelta(seconds=5))
    assert prefixed.underlying_store.get("p/k") == b"v"
    nested = tdist.PrefixStore("q", prefixed)
    nested.set("x", b"1")
    assert prefixed.get("q/x") == b"1"


def test_a_file_store_torch_held_is_released_and_cleaned_up_when_torch_lets_go(
    tmp_path: Path,
) -> None:
    from ferrodist.stores import _lifetime

    assert _lifetime._layout_ok(), "the precise keep-alive is in effect on this torch"
    path = tmp_path / "store"
    prefixed = tdist.PrefixStore("x", ferrodist.FileStore(str(path), 1))
    gc.collect()
    prefixed.set("k", "v")
    assert prefixed.get("k") == b"v"
    assert path.exists()
    del prefixed
    gc.collect()
    # torch let go, so the only instance closed and (world_size 1) removed the file.
    assert not path.exists()


# On a torch release whose object layout no test has pinned, ferrodist must read no torch
# memory (a wrong guess crashes the process) and still keep a store torch holds alive.
UNTESTED_TORCH = """
import ctypes, gc
import torch, torch.distributed as dist
torch.__version__ = "2.99.0"
reads = []
def spy(cls, address):
    reads.append(cls.__name__)
    raise AssertionError("read foreign memory")
for cls in (ctypes.c_void_p, ctypes.c_uint64):
    cls.from_address = classmethod(spy)
import ferrodist
from ferrodist.stores import _lifetime
prefixed = dist.PrefixStore("p", ferrodist.HashStore())
gc.collect()
prefixed.set("k", "v")
print("got", prefixed.get("k"), "layout", _lifetime._layout_ok(), "reads", reads)
"""


def test_on_an_untested_torch_no_foreign_memory_is_read_and_stores_stay_alive() -> None:
    (out,) = finish([spawn(UNTESTED_TORCH)])
    assert "got b'v' layout False reads []" in out, out


@pytest.mark.parametrize(
    "make_base",
    [tdist.HashStore, ferrodist.HashStore, lambda: tdist.PrefixStore("t", tdist.HashStore())],
    ids=["torch-hash", "ferrodist-hash", "torch-prefix"],
)
def test_ferrodist_prefix_store_wraps_any_store(make_base: object) -> None:
    base = make_base()  # type: ignore[operator]
    store = ferrodist.PrefixStore("pre", base)
    assert isinstance(store, tdist.Store)
    assert store.underlying_store is base
    store.set("k", "v")
    assert base.get("pre/k") == b"v"
    assert store.get("k") == b"v"
    assert store.add("n", 5) == 5
    assert store.compare_set("k", "v", b"w") == b"w"
    assert store.check(["k", "n"]) and not store.check(["zz"])
    assert store.num_keys() == base.num_keys()
    assert store.has_extended_api() == base.has_extended_api()
    store.set_timeout(timedelta(milliseconds=50))
    assert base.timeout == timedelta(milliseconds=50)
    with pytest.raises(tdist.DistStoreError, match="missing"):
        store.wait(["missing"])
    assert store.delete_key("k")
    if hasattr(base, "clone"):  # torch 2.4's stores have none to clone through
        assert isinstance(store.clone(), ferrodist.PrefixStore)


def test_prefix_store_arguments_are_checked_like_torch() -> None:
    with pytest.raises(ValueError, match="store argument cannot be None"):
        ferrodist.PrefixStore("p", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="store"):
        ferrodist.PrefixStore("p", object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="prefix"):
        ferrodist.PrefixStore(3, ferrodist.HashStore())  # type: ignore[arg-type]


def test_underlying_non_prefix_store_skips_every_prefix_layer() -> None:
    base = ferrodist.HashStore()
    store = ferrodist.PrefixStore("a", tdist.PrefixStore("b", ferrodist.PrefixStore("c", base)))
    assert store._underlying_non_prefix_store is base
    store.set("k", "v")
    assert base.get("c/b/a/k") == b"v"


WAITER = """
import sys, time
from datetime import timedelta
import ferrodist
for store in (ferrodist.HashStore(), ferrodist.FileStore(sys.argv[1])):
    print("waiting", type(store).__name__, flush=True)
    start = time.monotonic()
    try:
        store.wait(["never"], timedelta(seconds=120))
    except KeyboardInterrupt:
        print("interrupted", type(store).__name__, time.monotonic() - start, flush=True)
"""


@pytest.mark.timeout(60)
def test_ctrl_c_interrupts_a_blocked_wait(tmp_path: Path) -> None:
    proc = spawn(WAITER, str(tmp_path / "store"))
    try:
        assert proc.stdout is not None
        for kind in ("HashStore", "FileStore"):
            assert proc.stdout.readline().strip() == f"waiting {kind}"
            time.sleep(1.0)  # let it block inside wait
            proc.send_signal(signal.SIGINT)
            word, name, blocked_for = proc.stdout.readline().split()
            assert (word, name) == ("interrupted", kind)
            # It was blocked in wait (not before it), and Ctrl-C ended it promptly.
            assert 0.5 < float(blocked_for) < 10
    finally:
        finish([proc], timeout=20)
