"""Creating, inspecting and tearing down process groups.

``init_process_group`` is ferrodist's: it runs the rendezvous (``ferrodist.rdzv.join``, which
hosts the store in rank 0 for ``tcp://`` and ``env://``, reports progress and names missing ranks
on timeout) and then hands the store to torch's ``init_process_group``, which builds the gloo or
NCCL backend over it. The default group therefore lives in torch's own registry, so everything
downstream (torch's DDP, FSDP, functional collectives, ``torch.distributed.get_rank()``) sees it.
Every other name here is torch's function itself, but for ``destroy_process_group``.

Why ferrodist holds the default group's stores: a store written in Python (every ferrodist store
is a Python subclass of ``torch.distributed.Store``) reaches torch's C++ through a trampoline that
finds the Python methods on the live Python object. torch's C++ keeps only its own handle, so
once the last Python reference goes (``init_process_group(store=SomeStore(...))``, or the store
our rendezvous made), later calls such as ``new_group()`` fail with torch's "Not implemented"
assertion. ``_default_group_stores`` keeps them alive until ``destroy_process_group`` ends the
default group, which also lets rank 0's embedded server stop and free its port.

While the default group lives, the flight recorder's watchdog thread (``ferrodist.debug``)
publishes this rank's op summary to the group's store and diagnoses hangs; it starts here and
stops before the group is destroyed.

Why a destroyed group must really end, and before the interpreter does (its gloo threads may
otherwise abort the process at exit): ``ferrodist._group_release``.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Optional, Union

import torch
import torch.distributed as _tdist
from torch.distributed import (
    default_pg_timeout,
    get_backend,
    get_backend_config,
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_pg_count,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    is_available,
    is_backend_available,
    is_gloo_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    is_ucc_available,
    new_group,
    new_subgroups,
    new_subgroups_by_enumeration,
    supports_complex,
)

from ferrodist import _group_release
from ferrodist.debug import _watchdog
from ferrodist.rdzv.join import join as join_rendezvous
from ferrodist.stores.prefix import PrefixStore

__all__ = [
    "default_pg_timeout",
    "destroy_process_group",
    "get_backend",
    "get_backend_config",
    "get_global_rank",
    "get_group_rank",
    "get_node_local_rank",
    "get_pg_count",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_available",
    "is_backend_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "is_ucc_available",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "supports_complex",
]


logger = logging.getLogger("ferrodist.process_group")

_default_group_stores: list[_tdist.Store] = []
_rendezvous_stores: list[_tdist.Store] = []
"""The stores ferrodist's rendezvous built for the default group (not the caller's)."""


def destroy_process_group(group: Optional[_tdist.ProcessGroup] = None) -> None:
    """``torch.distributed.destroy_process_group``; ending the default group releases its stores."""
    ends_default = group is None or group is _tdist.GroupMember.WORLD
    if ends_default:
        _watchdog.stop()
    _tdist.destroy_process_group(group)
    if ends_default:
        _stop_servers(_rendezvous_stores)
        _rendezvous_stores.clear()
        _default_group_stores.clear()
    # torch modules imported while the group lived may hold it in a default argument, which would
    # keep its gloo threads alive into interpreter exit (see _group_release).
    _group_release.release_destroyed_defaults()


def _stop_servers(made_here: list[_tdist.Store]) -> None:
    """Stop the servers of stores the rendezvous built: nothing else may rely on them, so their
    ports are freed now rather than whenever the objects happen to be collected."""
    for store in made_here:
        stop = getattr(store, "_stop_server", None)
        if stop is not None:
            stop()


def _undo_failed_init(made_here: list[_tdist.Store]) -> None:
    """After torch's ``init_process_group`` raised: no default group stays behind (torch keeps
    the one it registered when a later step fails, the ``TORCH_DIST_INIT_BARRIER`` barrier for
    one), and the servers of ``made_here`` stop. The caller re-raises the original error, so a
    failure here is only logged."""
    try:
        if is_initialized():
            _tdist.destroy_process_group()
    except Exception:
        logger.warning("destroying the half-initialized default group failed", exc_info=True)
    finally:
        _stop_servers(made_here)


def _default_timeout(backend: Optional[str]) -> timedelta:
    """torch's default for ``backend`` (NCCL has its own constant)."""
    if backend is not None and str(backend).lower() == "nccl":
        nccl = _tdist.constants.default_pg_nccl_timeout
        if isinstance(nccl, timedelta):
            return nccl
    return default_pg_timeout


def init_process_group(
    backend: Optional[str] = None,
    init_method: Optional[str] = None,
    timeout: Optional[timedelta] = None,
    world_size: int = -1,
    rank: int = -1,
    store: Optional[_tdist.Store] = None,
    group_name: str = "",
    pg_options: Optional[Any] = None,
    device_id: Optional[Union[torch.device, int]] = None,
    **torch_options: Any,
) -> None:
    """Initialize the default process group, as ``torch.distributed.init_process_group``.

    Args:
        backend: ``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``...; None picks torch's default
            for the devices present.
        init_method: ``env://`` (the default when ``store`` is None), ``tcp://host:port`` or
            ``file:///path``; ``tcp://`` and ``env://`` host ferrodist's TCP store in rank 0.
        timeout: for the rendezvous and the backend's operations (torch's default if None).
        world_size: number of ranks (-1: from the URL or environment); required with ``store``.
        rank: this process's rank (-1: from the URL or environment); required with ``store``.
        store: a store every rank shares, instead of ``init_method``.
        group_name, pg_options, device_id: passed to torch unchanged.
        torch_options: the installed torch's newer keyword arguments (``enable_reconfigure``
            in 2.15), passed to it unchanged; one it lacks raises its ``TypeError``.

    Raises:
        ValueError: the default group already exists, both ``init_method`` and ``store`` were
            given, or the URL or environment lacks the rank, world size or address.
        StoreTimeoutError: (a ``DistStoreError`` and a ``TimeoutError``) ranks failed to join
            in time; the message names them.

    When torch's part fails, it leaves no default group behind (torch's own keeps one when a
    step after registering it fails) and stops the store server its rendezvous started.
    """
    if is_initialized():
        raise ValueError("trying to initialize the default process group twice!")
    if init_method is not None and store is not None:
        raise ValueError("Cannot specify both init_method and store.")
    if timeout is None:
        timeout = _default_timeout(backend)
    elif not isinstance(timeout, timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    store_given = store
    stores = [] if store is None else [store]
    if store is None:
        url = init_method if init_method is not None else "env://"
        base, rank, world_size = join_rendezvous(url, rank, world_size, timeout)
        # torch prefixes the store it builds this way; the backend's keys match torch's, and
        # the prefix store is ferrodist's, as torch's is torch's.
        store = PrefixStore("default_pg", base)
        stores.append(base)
    try:
        _tdist.init_process_group(
            backend,
            timeout=timeout,
            world_size=world_size,
            rank=rank,
            store=store,
            group_name=group_name,
            pg_options=pg_options,
            device_id=device_id,
            **torch_options,
        )
    except BaseException:
        _undo_failed_init(stores if store_given is None else [])
        raise
    _default_group_stores[:] = stores
    _rendezvous_stores[:] = stores if store_given is None else []
    # The flight recorder's hang watchdog publishes to the store every rank shares.
    _watchdog.start(stores[0], get_rank(), get_world_size(), timeout)
