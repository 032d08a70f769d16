"""etcd clusters with auth enabled, for the credential tests: a ``root`` user with a password
that the tests then look for in every message, log and argument list.

Auth is switched on through etcd's HTTP gateway (``/v3/auth/...``), as ``etcdctl user add``,
``user grant-role`` and ``auth enable`` would; over TLS the gateway is asked with the test
client certificate. With ``--client-cert-auth`` the gateway forwards each call to its own member
with the member's certificate as the client's, so that certificate must allow client use too
(:func:`make_tls`; etcd answers 503 otherwise).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import etcd_support
from etcd_support import EtcdCluster, Tls

# Distinct enough that finding it anywhere can only mean it leaked.
SECRET = "Zq7-hunter2-s3cret"
USER = "root"


def make_tls(directory: Path) -> Tls:
    """``etcd_support.make_tls``, with the member certificate signed for client use as well."""
    tls = etcd_support.make_tls(directory)
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "extendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n"
    )
    subprocess.run(
        ["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
         "-CAcreateserial", "-days", "2", "-out", "server.pem", "-extfile", "server.ext"],
        check=True, capture_output=True, cwd=directory,
    )  # fmt: skip
    return tls


def _gateway(cluster: EtcdCluster, path: str, body: dict[str, str]) -> None:
    scheme, context = "http", None
    if cluster.tls is not None:
        scheme = "https"
        context = ssl.create_default_context(cafile=str(cluster.tls.ca_file))
        context.load_cert_chain(str(cluster.tls.client_cert), str(cluster.tls.client_key))
    url = f"{scheme}://{cluster.endpoint_list()[0]}/v3/{path}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=5, context=context) as reply:
        reply.read()


def enable_auth(cluster: EtcdCluster, password: str = SECRET) -> None:
    """Adds ``root`` with ``password``, gives it the root role and turns auth on."""
    _gateway(cluster, "auth/user/add", {"name": USER, "password": password})
    _gateway(cluster, "auth/user/grant", {"user": USER, "role": "root"})
    _gateway(cluster, "auth/enable", {})


@contextmanager
def auth_cluster(tls: Optional[Tls] = None) -> Iterator[EtcdCluster]:
    """A 1-member cluster (plain http, or TLS with client certificates) with auth on."""
    with etcd_support.etcd_cluster(1, tls=tls) as cluster:
        enable_auth(cluster)
        yield cluster
