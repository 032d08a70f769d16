"""``etcd://`` URLs: ``etcd://[user:password@]host:port[,host:port...]/JOB[?query]``.

One URL names the cluster, the job and how to log in, for ``init_process_group(init_method=...)``,
``ferrodist.rendezvous`` and torch's own dispatcher (the scheme is registered there too). The
job name becomes the store prefix: every key of the run lives under ``JOB/`` in etcd, so a name
must not be reused by a later run before ``EtcdStore(...).purge()`` (an old run's completed
count would let a new one's ranks through early).

Query parameters, besides torch's ``rank`` and ``world_size``: ``ca_file``, ``cert_file``,
``key_file`` and ``tls_domain`` (TLS; endpoints then speak https). The password may also come
from the environment, ``FERRODIST_ETCD_PASSWORD``, to keep it out of logs that print the URL.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["PASSWORD_ENV", "etcd_store_from_url", "parse_etcd_url"]

PASSWORD_ENV = "FERRODIST_ETCD_PASSWORD"

_TLS_PARAMETERS = ("ca_file", "cert_file", "key_file", "tls_domain")


def _error(message: str) -> ValueError:
    return ValueError(f"Error initializing torch.distributed using etcd:// rendezvous: {message}")


def parse_etcd_url(url: str) -> tuple[list[str], str, dict[str, Any]]:
    """``(endpoints, job, EtcdStore keyword arguments)`` from an ``etcd://`` URL."""
    parts = urlsplit(url)
    if parts.scheme != "etcd":
        raise _error(f"not an etcd:// URL: {url!r}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    endpoints = [h.strip() for h in hosts.split(",")]
    if not hosts or any(not h for h in endpoints):
        raise _error(f"no etcd endpoints (etcd://host:port[,host:port]/JOB), got {url!r}")
    job = parts.path.strip("/")
    if not job:
        raise _error(f"a job name is missing (etcd://host:port/JOB), got {url!r}")
    kwargs: dict[str, Any] = {}
    if userinfo:
        user, has_password, password = userinfo.partition(":")
        kwargs["username"] = unquote(user)
        kwargs["password"] = unquote(password) if has_password else os.environ.get(PASSWORD_ENV)
    query = dict(item.split("=", 1) for item in parts.query.split("&") if "=" in item)
    for name in _TLS_PARAMETERS:
        if name in query:
            kwargs[name] = unquote(query[name])
    return endpoints, job, kwargs


def etcd_store_from_url(url: str, timeout: timedelta) -> Any:
    """The ``EtcdStore`` an ``etcd://`` URL names."""
    from ferrodist.etcd_store import EtcdStore

    endpoints, job, kwargs = parse_etcd_url(url)
    return EtcdStore(endpoints, job, timeout, **kwargs)
