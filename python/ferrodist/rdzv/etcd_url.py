"""``etcd://`` URLs: ``etcd://[user@]host:port[,host:port...]/JOB[?query]``.

One URL names the cluster, the job and who logs in, for ``init_process_group(init_method=...)``,
``ferrodist.rendezvous`` and torch's own dispatcher (the scheme is registered there too). The
job name becomes the store prefix (letters, digits, ``.``, ``_``, ``-`` in segments joined by
single ``/``): every key of the run lives under ``JOB:`` in etcd, in no other job's range, so a
name must not be reused by a later run before ``EtcdStore(...).purge()`` (an old run's completed
count would let a new one's ranks through early).

Query parameters, besides torch's ``rank`` and ``world_size``: ``ca_file``, ``cert_file``,
``key_file`` and ``tls_domain`` (TLS; endpoints then speak https), ``password_file`` and
``insecure_plaintext_credentials=1``.

No password in the URL: a URL is echoed in messages (torch's own included), logged, and often
passed on a command line that every user of the host can read. A ``user:password@`` URL, or a
``password=`` parameter, is refused with a message that says where the password goes instead:
the file ``password_file=`` names, or ``FERRODIST_ETCD_PASSWORD``. Every message quotes the URL
with any password in it redacted.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

from ferrodist import _native
from ferrodist._redact import redact_url
from ferrodist.stores.etcd import EtcdStore

__all__ = ["PASSWORD_ENV", "etcd_store_from_url", "parse_etcd_url"]

PASSWORD_ENV = "FERRODIST_ETCD_PASSWORD"

_PATH_PARAMETERS = ("ca_file", "cert_file", "key_file", "tls_domain", "password_file")
_INSECURE = "insecure_plaintext_credentials"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")

_NO_PASSWORD_HERE = (
    "a password in the URL is refused (URLs end up in messages, logs and command lines): "
    f"keep etcd://USER@... and put the password in {PASSWORD_ENV} or in a file named by "
    "?password_file=PATH"
)


def _error(message: str) -> ValueError:
    return ValueError(f"Error initializing torch.distributed using etcd:// rendezvous: {message}")


def parse_etcd_url(url: str) -> tuple[list[str], str, dict[str, Any]]:
    """``(endpoints, job, EtcdStore keyword arguments)`` from an ``etcd://`` URL."""
    shown = redact_url(url)
    parts = urlsplit(url)
    if parts.scheme != "etcd":
        raise _error(f"not an etcd:// URL: {shown!r}")
    if shown != url or "@" in parts.path:
        raise _error(f"{_NO_PASSWORD_HERE}; got {shown!r}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    endpoints = [h.strip() for h in hosts.split(",")]
    if not hosts or any(not h for h in endpoints):
        raise _error(f"no etcd endpoints (etcd://host:port[,host:port]/JOB), got {shown!r}")
    job = parts.path.strip("/")
    if not job:
        raise _error(f"a job name is missing (etcd://host:port/JOB), got {shown!r}")
    try:
        _native.check_etcd_prefix(job)
    except ValueError as err:
        raise _error(f"the job name (etcd://host:port/JOB) is not a valid prefix: {err}") from None
    query = dict(item.split("=", 1) for item in parts.query.split("&") if "=" in item)
    if "password" in query:
        raise _error(f"{_NO_PASSWORD_HERE}; got {shown.split('?')[0]!r}?...")
    kwargs: dict[str, Any] = {}
    if userinfo:
        kwargs["username"] = unquote(userinfo)
    for name in _PATH_PARAMETERS:
        if name in query:
            kwargs[name] = unquote(query[name])
    if _INSECURE in query:
        flag = unquote(query[_INSECURE]).lower()
        if flag not in _TRUE + _FALSE:
            raise _error(f"{_INSECURE} takes 1 or 0, got {flag!r}")
        kwargs[_INSECURE] = flag in _TRUE
    return endpoints, job, kwargs


def etcd_store_from_url(url: str, timeout: timedelta) -> Any:
    """The ``EtcdStore`` an ``etcd://`` URL names."""
    endpoints, job, kwargs = parse_etcd_url(url)
    return EtcdStore(endpoints, job, timeout, **kwargs)
