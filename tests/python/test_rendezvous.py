"""Rendezvous in one process: ranks as threads against real TCP and file stores.

Checks that a waiting rendezvous logs which ranks joined and which are missing, that its timeout
names the missing ranks (and is caught as torch's DistStoreError and as TimeoutError), and the
argument errors init_process_group raises before any group exists.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as tdist

import ferrodist as dist
from ferrodist.rdzv import join as rdzv


def _in_threads(urls_by_rank: dict[int, str], world: int, timeout_s: float, **kw: Any) -> dict:
    """Run rendezvous for each rank in a thread; {rank: result or exception}."""
    results: dict[int, Any] = {}

    def one(rank: int, url: str) -> None:
        try:
            results[rank] = rdzv.join(url, rank, world, timedelta(seconds=timeout_s), **kw)
        except Exception as e:
            results[rank] = e

    threads = [threading.Thread(target=one, args=(r, u)) for r, u in urls_by_rank.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    assert not any(t.is_alive() for t in threads), "a rendezvous thread never returned"
    return results


@pytest.mark.timeout(60)
def test_tcp_rendezvous_gives_every_rank_one_shared_store(free_port: int):
    url = f"tcp://127.0.0.1:{free_port}"
    results = _in_threads({0: url, 1: url}, 2, 20)
    (s0, r0, w0), (s1, r1, w1) = results[0], results[1]
    assert (r0, w0, r1, w1) == (0, 2, 1, 2)
    assert isinstance(s0, dist.Store)
    s0.set("from-0", "hello")
    assert s1.get("from-0") == b"hello"


@pytest.mark.timeout(60)
def test_file_rendezvous_reads_rank_and_world_size_from_the_url(tmp_path: Path):
    path = tmp_path / "store"
    urls = {r: f"file://{path}?rank={r}&world_size=2" for r in range(2)}
    results = _in_threads(urls, 2, 20, progress_interval=0.2)
    assert [results[r][1:] for r in range(2)] == [(0, 2), (1, 2)]
    results[1][0].set("k", "v")
    assert results[0][0].get("k") == b"v"


@pytest.mark.timeout(60)
def test_timeout_names_the_missing_ranks_and_progress_is_logged(
    free_port: int, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="ferrodist.rendezvous")
    url = f"tcp://127.0.0.1:{free_port}"
    results = _in_threads({0: url, 2: url}, 4, 1.5, progress_interval=0.3)
    for rank in (0, 2):
        err = results[rank]
        assert isinstance(err, dist.StoreTimeoutError), err
        assert isinstance(err, tdist.DistStoreError) and isinstance(err, TimeoutError)
        assert "2/4 ranks joined" in str(err) and "missing ranks: [1, 3]" in str(err)
    progress = [r.getMessage() for r in caplog.records if "waiting in rendezvous" in r.message]
    assert progress, "no progress line was logged while waiting"
    assert any("missing ranks: [1, 3]" in m for m in progress)


@pytest.mark.timeout(60)
def test_a_client_whose_host_never_starts_names_rank_0(free_port: int):
    url = f"tcp://127.0.0.1:{free_port}?rank=1&world_size=2"
    with pytest.raises(tdist.DistError, match=r"missing ranks: \[0\]"):
        rdzv.join(url, timeout=timedelta(seconds=1))


@pytest.mark.timeout(30)
def test_progress_interval_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(rdzv.PROGRESS_ENV, "0.25")
    assert rdzv._progress_interval(None) == 0.25
    assert rdzv._progress_interval(2) == 2.0
    monkeypatch.setenv(rdzv.PROGRESS_ENV, "soon")
    with pytest.raises(ValueError, match=rdzv.PROGRESS_ENV):
        rdzv._progress_interval(None)
    monkeypatch.delenv(rdzv.PROGRESS_ENV)
    assert rdzv._progress_interval(None) == rdzv.DEFAULT_PROGRESS_S


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("tcp://127.0.0.1:29999", "rank parameter missing"),
        ("tcp://127.0.0.1:29999?rank=0", "world_size parameter missing"),
        ("file:///tmp/x?world_size=2", "rank parameter missing"),
        ("ftp://somewhere", "No rendezvous handler for ftp://"),
        ("tcp://127.0.0.1:29999?rank=3&world_size=2", "out of range"),
        ("file:///tmp/x?rank=-2&world_size=2", "out of range"),
    ],
)
def test_bad_urls_raise_value_error(url: str, message: str):
    with pytest.raises(ValueError, match=message):
        rdzv.join(url, timeout=timedelta(seconds=1))


@pytest.mark.timeout(60)
def test_a_scheme_registered_with_torch_is_used_by_init_process_group():
    seen: list[str] = []

    def handler(url: str, **kwargs: Any) -> Any:
        seen.append(url)  # torch's dispatcher has put rank and world_size into the query
        yield tdist.HashStore(), 0, 1

    dist.register_rendezvous_handler("ferrodisttest", handler)
    dist.init_process_group("gloo", init_method="ferrodisttest://job7", rank=0, world_size=1)
    try:
        assert dist.get_world_size() == 1 and dist.get_rank() == 0
        assert seen == ["ferrodisttest://job7?rank=0&world_size=1"]
    finally:
        dist.destroy_process_group()


def test_env_rendezvous_names_the_missing_variable(monkeypatch: pytest.MonkeyPatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="MASTER_ADDR expected"):
        dist.init_process_group("gloo")
    assert not dist.is_initialized()


def test_init_process_group_rejects_bad_arguments():
    store = tdist.HashStore()
    with pytest.raises(ValueError, match="both init_method and store"):
        dist.init_process_group("gloo", init_method="env://", store=store)
    with pytest.raises(TypeError, match="timeout"):
        dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=5)  # type: ignore[arg-type]
    assert not dist.is_initialized()


@pytest.mark.timeout(60)
def test_world_of_one_runs_collectives_and_premul_sum_in_process():
    import torch

    # a temporary ferrodist (Python) store: ferrodist keeps it alive for new_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="twice"):
            dist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
        t = torch.arange(4.0)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(3.0))
        assert torch.equal(t, torch.arange(4.0) * 3)
        work = dist.all_reduce(t, async_op=True, group=dist.new_group())
        assert isinstance(work, tdist.Work)
        work.wait()
        assert dist.get_backend() == tdist.get_backend() == "gloo"
    finally:
        dist.destroy_process_group()
    assert not tdist.is_initialized()


@pytest.mark.timeout(60)
def test_tcp_port_is_free_again_after_destroy(free_port: int):
    url = f"tcp://127.0.0.1:{free_port}?rank=0&world_size=1"
    held = []  # a reference kept elsewhere must not keep the port: destroy stops the server
    for _ in range(2):  # the second init binds the same port: the first server must be gone
        dist.init_process_group("gloo", init_method=url, timeout=timedelta(seconds=20))
        dist.barrier()
        held.extend(dist.process_group._rendezvous_stores)
        dist.destroy_process_group()
    assert len(held) == 2 and all(isinstance(s, dist.TCPStore) for s in held)


@pytest.mark.timeout(60)
def test_each_torchelastic_restart_waits_afresh(monkeypatch: pytest.MonkeyPatch):
    # the agent's store survives a restart; a finished attempt must not let the next one through
    store = tdist.HashStore()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    rdzv.wait_for_ranks(store, 0, 1, timedelta(seconds=5))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with pytest.raises(dist.StoreTimeoutError, match=r"missing ranks: \[1\]"):
        rdzv.wait_for_ranks(store, 0, 2, timedelta(seconds=0.5), progress_interval=0.2)


class _CountingStore(tdist.Store):
    """torch's HashStore behind a Python store that counts the calls it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = tdist.HashStore()
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if name in ("set", "get", "add", "check", "wait", "append", "multi_get"):
            object.__getattribute__(self, "calls").append(name)
            return getattr(object.__getattribute__(self, "inner"), name)
        return object.__getattribute__(self, name)


@pytest.mark.timeout(60)
def test_a_progress_report_costs_one_request_whatever_the_world_size():
    store = _CountingStore()
    with pytest.raises(dist.StoreTimeoutError, match=r"1/512 ranks joined"):
        rdzv.wait_for_ranks(store, 0, 512, timedelta(seconds=1), progress_interval=0.2)
    reports = store.calls.count("get")  # one per report (waits come in 100 ms slices)
    assert 3 <= reports <= 8, store.calls
    assert "check" not in store.calls, "no per-rank checks"
    assert [c for c in store.calls if c not in ("wait", "get")] == ["append", "add"]
