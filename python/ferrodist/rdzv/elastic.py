"""A torchrun rendezvous backend on etcd: ``torchrun --rdzv-backend=ferrodist-etcd``.

torch's own ``etcd`` backends need the ``python-etcd`` package and etcd's v2 API (removed from
etcd 3.6). This one is torch's ``DynamicRendezvousHandler`` (the handler behind torch's ``c10d``
backend: same join, last-call, heartbeat and re-rendezvous rules) with its state in a
ferrodist :class:`~ferrodist.EtcdStore` through torch's ``C10dRendezvousBackend``, so the agents'
rendezvous survives the loss of any host, the one that would have served a ``c10d`` store
included.

Usage::

    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=ferrodist-etcd \\
        --rdzv-endpoint=etcd1:2379,etcd2:2379,etcd3:2379 --rdzv-id=job-42 train.py

``--rdzv-conf`` takes, besides torch's ``join_timeout``, ``last_call_timeout``,
``close_timeout`` and ``heartbeat``: ``read_timeout`` (seconds, default 60: the store timeout),
``prefix`` (default ``torchrun``; the job's etcd prefix is ``PREFIX/RUN_ID``), ``username``,
``password_file``, ``insecure_plaintext_credentials``, ``ca_file``, ``cert_file``, ``key_file``
and ``tls_domain``.

No ``password``: ``--rdzv-conf`` is on torchrun's command line, which every user of the host
reads in ``ps``, and torch logs the whole conf at start. A ``password`` there is refused; the
password goes in a file (``password_file=PATH``) or in ``FERRODIST_ETCD_PASSWORD``. Credentials
go only over TLS (``ca_file``) unless ``insecure_plaintext_credentials=1``.

``--rdzv-id`` is required: torchrun's default run id, ``none``, is the same for every run that
names none, so two unrelated jobs on one etcd cluster would join one rendezvous (and share every
key). It is part of the job's etcd prefix, so it takes letters, digits, ``.``, ``_`` and ``-``.

torch finds the backend through the ``torchrun.handlers`` entry point an installed ferrodist
declares (pyproject.toml); :func:`register` does the same by hand (a checkout that is not
installed, or a program that builds its own agent).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Callable

from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousParameters,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    create_handler as _dynamic_handler,
)

from ferrodist import _native
from ferrodist.rdzv.etcd_url import PASSWORD_ENV
from ferrodist.stores.etcd import EtcdStore

__all__ = ["BACKEND_NAME", "EtcdRendezvousBackend", "create_handler", "handler_factory", "register"]

BACKEND_NAME = "ferrodist-etcd"

_STORE_OPTIONS = ("username", "password_file", "ca_file", "cert_file", "key_file", "tls_domain")
_INSECURE = "insecure_plaintext_credentials"
_TORCHRUN_DEFAULT_RUN_ID = "none"


class EtcdRendezvousBackend(C10dRendezvousBackend):
    """torch's store-backed rendezvous state (compare-and-set of one key), on an EtcdStore."""

    @property
    def name(self) -> str:
        return BACKEND_NAME


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """A ``DynamicRendezvousHandler`` whose state lives in etcd (torch's handler creator
    signature: ``RendezvousParameters`` in, ``RendezvousHandler`` out)."""
    if not params.endpoint:
        raise ValueError(
            f"--rdzv-backend={BACKEND_NAME} needs --rdzv-endpoint=host:port[,host:port...]"
        )
    if params.get("password") is not None:
        raise ValueError(
            f"--rdzv-backend={BACKEND_NAME}: a password in --rdzv-conf is refused (the command "
            "line is readable by every user of the host, and torch logs the conf); put it in a "
            f"file and pass password_file=PATH, or set {PASSWORD_ENV}"
        )
    if params.run_id == _TORCHRUN_DEFAULT_RUN_ID:
        raise ValueError(
            f"--rdzv-backend={BACKEND_NAME} needs --rdzv-id=ID, unique to the job: torchrun's "
            f"default id {_TORCHRUN_DEFAULT_RUN_ID!r} is every such run's, so unrelated jobs on "
            "the etcd cluster would join one rendezvous and share its keys"
        )
    read_timeout = params.get_as_int("read_timeout", 60) or 60
    job = f"{str(params.get('prefix', 'torchrun')).rstrip('/')}/{params.run_id}"
    try:
        _native.check_etcd_prefix(job)
    except ValueError as err:
        raise ValueError(
            f"--rdzv-backend={BACKEND_NAME}: --rdzv-conf prefix and --rdzv-id make the job's "
            f"etcd prefix, which must be letters, digits, '.', '_', '-' joined by single '/' "
            f"({err})"
        ) from None
    options = {name: params.get(name) for name in _STORE_OPTIONS if params.get(name) is not None}
    store = EtcdStore(
        params.endpoint,
        job,
        timedelta(seconds=read_timeout),
        insecure_plaintext_credentials=bool(params.get_as_bool(_INSECURE, False)),
        **options,
    )
    return _dynamic_handler(store, EtcdRendezvousBackend(store, params.run_id), params)


def handler_factory() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The ``torchrun.handlers`` entry point: torch calls it and registers what it returns."""
    return create_handler


def register() -> None:
    """Registers ``ferrodist-etcd`` in torch's rendezvous handler registry (idempotent)."""
    rendezvous_handler_registry.register(BACKEND_NAME, create_handler)
