"""Shared fixtures for the Python tests."""

from __future__ import annotations

import itertools
import os
import re
import socket
from collections.abc import Iterator

import etcd_support
import pytest
import torch
import torch.distributed as dist
from etcd_support import EtcdCluster
from torch.torch_version import TorchVersion

_PREFIXES = itertools.count()

# Every Python process a test starts (spawned workers, subprocesses) inherits this: a crash in
# native code (a segfault, glibc's abort on a corrupted heap) then prints each thread's Python
# stack to the output the test shows, instead of a bare signal.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

# The torch side of the parity scenarios (test_store_parity, test_store_dropin) asserts torch's
# behaviour as documented for 2.11-2.15. torch 2.4 differs in ways no attribute reveals (its
# servers close the connection on PING, a failed bind is a bare RuntimeError, world_size=0
# segfaults), so there only ferrodist's side runs; it must still behave as the documented torch.
TORCH_SIDE_SKIPPED = TorchVersion(torch.__version__) < (2, 11)
TORCH_SIDE_REASON = "torch < 2.11 differs from the documented behaviour this scenario asserts"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests exist everywhere and run only where CUDA is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def etcd_cluster() -> Iterator[EtcdCluster]:
    """A real 3-member etcd cluster on loopback ports, shared by the session's tests (each
    keeps apart with its own prefix; see ``etcd_prefix``). Fault tests start their own."""
    with etcd_support.etcd_cluster(3) as cluster:
        yield cluster


@pytest.fixture
def etcd_prefix(request: pytest.FixtureRequest) -> str:
    """A job prefix no other test uses (the test's name, parameters and all, in the characters
    a prefix may hold)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)
    return f"test-{os.getpid()}-{next(_PREFIXES)}-{name}"


@pytest.fixture
def nccl_world() -> Iterator[None]:
    """A one-rank NCCL default group on GPU 0 (for tests marked ``gpu``)."""
    free = socket.socket()
    with free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield None
    dist.destroy_process_group()


@pytest.fixture
def leaves_no_group() -> Iterator[None]:
    """Runs a test that initializes the default group; destroys it however the test ends."""
    assert not dist.is_initialized(), "an earlier test left a default group behind"
    try:
        yield None
    finally:
        if dist.is_initialized():
            import ferrodist

            ferrodist.destroy_process_group()
