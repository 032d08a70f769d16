"""etcd credentials from Python: a password never shows in a message, a log or a ``repr``, never
comes from a URL or torchrun's ``--rdzv-conf`` (both end up on command lines and in logs), a
user name needs a password, and credentials go only over TLS unless
``insecure_plaintext_credentials`` says otherwise. Against real etcd clusters with auth on."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as tdist
from etcd_auth import SECRET, USER, auth_cluster, make_tls
from etcd_support import EtcdCluster
from torch.distributed.elastic.rendezvous import RendezvousParameters

import ferrodist
from ferrodist.rdzv import elastic as elastic_rendezvous
from ferrodist.rdzv.etcd_url import PASSWORD_ENV

pytestmark = pytest.mark.timeout(120)

TIMEOUT = timedelta(seconds=10)


@pytest.fixture(scope="module")
def plain_auth_cluster() -> Iterator[EtcdCluster]:
    with auth_cluster() as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def _no_password_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "etcd-password"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def _refusal(call: object, *args: object, **kwargs: object) -> BaseException:
    """The exception ``call(*args, **kwargs)`` raises (a generator is advanced once)."""
    with pytest.raises(BaseException) as caught:
        result = call(*args, **kwargs)  # type: ignore[operator]
        if isinstance(result, Iterator):
            next(result)
    return caught.value


def _shown(exc: BaseException) -> str:
    """Everything a traceback would print about ``exc``: message, args, repr, causes."""
    parts = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen), repr(seen.args)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def test_a_password_in_an_etcd_url_is_refused_and_never_echoed(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    host = "127.0.0.1:9"  # never contacted: the URL is refused first
    urls = [
        f"etcd://{USER}:{SECRET}@{host}/job",
        f"etcd://{USER}:{SECRET}@{host}/job?rank=0&world_size=1",
        f"etcd://{USER}:{SECRET}@{host}",  # and no job: refused for the password first
        f"etcd://{USER}:{SECRET}/x@{host}/job",  # an unescaped '/' in the password
        f"etcd://{USER}@{host}/job?password={SECRET}",
    ]
    for url in urls:
        failures = [
            _refusal(ferrodist.rendezvous, url, rank=0, world_size=1),
            _refusal(ferrodist.rendezvous, url),
            _refusal(tdist.rendezvous, url),  # torch's dispatcher, ferrodist's handler
            _refusal(ferrodist.init_process_group, "gloo", init_method=url, rank=0, world_size=1),
        ]
        for exc in failures:
            shown = _shown(exc)
            assert SECRET not in shown, shown
            assert isinstance(exc, (ValueError, AssertionError)), shown
        refused = _shown(failures[0])
        if "rank=0" not in url:
            assert PASSWORD_ENV in refused and "password_file" in refused, refused
    assert not ferrodist.is_initialized()
    # The node-specific-arguments check (rank given twice) quotes the URL, redacted.
    exc = _refusal(ferrodist.rendezvous, urls[1], rank=0, world_size=1)
    assert isinstance(exc, AssertionError) and "<redacted>" in str(exc), str(exc)
    out, err = capfd.readouterr()
    assert SECRET not in caplog.text + out + err


def test_a_user_needs_a_password_and_a_password_a_user(tmp_path: Path) -> None:
    nowhere = "127.0.0.1:9"
    for kwargs in ({"username": USER}, {"username": USER, "password": ""}):
        exc = _refusal(ferrodist.EtcdStore, nowhere, "p", TIMEOUT, **kwargs)
        assert isinstance(exc, ValueError) and PASSWORD_ENV in str(exc), _shown(exc)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    exc = _refusal(ferrodist.EtcdStore, nowhere, "p", TIMEOUT, username=USER, password_file=empty)
    assert isinstance(exc, ValueError) and "no password" in str(exc), _shown(exc)
    exc = _refusal(ferrodist.EtcdStore, nowhere, "p", TIMEOUT, password=SECRET)
    assert isinstance(exc, ValueError) and "without a user" in str(exc), _shown(exc)
    assert SECRET not in _shown(exc)
    missing = tmp_path / "missing"
    exc = _refusal(ferrodist.EtcdStore, nowhere, "p", TIMEOUT, username=USER, password_file=missing)
    assert isinstance(exc, ValueError) and str(missing) in str(exc), _shown(exc)
    # Through a URL: a user and no password anywhere.
    exc = _refusal(ferrodist.rendezvous, f"etcd://{USER}@{nowhere}/job", rank=0, world_size=1)
    assert isinstance(exc, ValueError) and PASSWORD_ENV in str(exc), _shown(exc)


def test_credentials_without_tls_are_refused_unless_explicitly_insecure(
    plain_auth_cluster: EtcdCluster, password_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoints = plain_auth_cluster.endpoints
    exc = _refusal(ferrodist.EtcdStore, endpoints, "p", TIMEOUT, username=USER, password=SECRET)
    assert isinstance(exc, ValueError), _shown(exc)
    assert "insecure_plaintext_credentials" in str(exc) and "TLS" in str(exc), str(exc)
    assert SECRET not in _shown(exc)
    # https endpoints with no TLS files would be TLS; an http:// one with a CA file is not.
    exc = _refusal(
        ferrodist.EtcdStore,
        [f"http://{plain_auth_cluster.endpoint_list()[0]}"],
        "p",
        TIMEOUT,
        username=USER,
        password=SECRET,
        ca_file=password_file,  # never read: refused before
    )
    assert isinstance(exc, ValueError) and "without TLS" in str(exc), _shown(exc)

    with pytest.warns(RuntimeWarning, match="without TLS"):
        store = ferrodist.EtcdStore(
            endpoints,
            "p",
            TIMEOUT,
            username=USER,
            password_file=password_file,
            insecure_plaintext_credentials=True,
        )
    store.set("k", "v")
    assert store.get("k") == b"v"
    assert SECRET not in repr(store) and SECRET not in str(store.__dict__)
    # From the environment, through a URL that asks for plaintext by name.
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    url = f"etcd://{USER}@{endpoints}/p?insecure_plaintext_credentials=1"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        via_url, _, _ = next(ferrodist.rendezvous(url, rank=0, world_size=1))
    assert via_url.get("k") == b"v"
    exc = _refusal(ferrodist.rendezvous, f"etcd://{USER}@{endpoints}/p", rank=0, world_size=1)
    assert isinstance(exc, ValueError) and "insecure_plaintext_credentials" in str(exc)


def test_a_refused_login_and_an_unreachable_cluster_do_not_show_the_password(
    plain_auth_cluster: EtcdCluster, free_port: int, capfd: pytest.CaptureFixture[str]
) -> None:
    for endpoints, password, expected in (
        (plain_auth_cluster.endpoints, SECRET + "-wrong", ValueError),
        (f"127.0.0.1:{free_port}", SECRET, tdist.DistError),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            exc = _refusal(
                ferrodist.EtcdStore,
                endpoints,
                "p",
                timedelta(milliseconds=500),
                username=USER,
                password=password,
                insecure_plaintext_credentials=True,
            )
        assert isinstance(exc, expected), _shown(exc)
        assert SECRET not in _shown(exc)
    # An endpoint with user info is refused without being quoted back.
    exc = _refusal(ferrodist.EtcdStore, f"http://{USER}:{SECRET}@127.0.0.1:9", "p", TIMEOUT)
    assert isinstance(exc, ValueError) and "user info" in str(exc), _shown(exc)
    exc = _refusal(ferrodist.EtcdStore, f"http://{USER}:{SECRET}@127.0.0.1:9,", "p", TIMEOUT)
    assert isinstance(exc, ValueError) and SECRET not in _shown(exc)
    out, err = capfd.readouterr()
    assert SECRET not in out + err


def test_credentials_over_tls_need_no_insecure_option(tmp_path: Path, password_file: Path) -> None:
    tls = make_tls(tmp_path / "pki")
    with auth_cluster(tls=tls) as cluster, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no plaintext warning over TLS
        store = ferrodist.EtcdStore(
            cluster.endpoints,
            "tls",
            TIMEOUT,
            username=USER,
            password_file=password_file,
            ca_file=tls.ca_file,
            cert_file=tls.client_cert,
            key_file=tls.client_key,
        )
        store.set("k", "v")
        assert store.get("k") == b"v"


def _rdzv_params(endpoint: str, **conf: Any) -> RendezvousParameters:
    return RendezvousParameters(
        backend=elastic_rendezvous.BACKEND_NAME,
        endpoint=endpoint,
        run_id="secrets",
        min_nodes=1,
        max_nodes=1,
        **conf,
    )


def test_the_torchrun_backend_refuses_a_password_in_rdzv_conf_and_takes_a_file(
    plain_auth_cluster: EtcdCluster, password_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    endpoints = plain_auth_cluster.endpoints
    exc = _refusal(
        elastic_rendezvous.create_handler,
        _rdzv_params(endpoints, username=USER, password=SECRET, insecure_plaintext_credentials=1),
    )
    assert isinstance(exc, ValueError), _shown(exc)
    assert "password_file" in str(exc) and PASSWORD_ENV in str(exc), str(exc)
    assert SECRET not in _shown(exc) + caplog.text
    # Without the insecure option the plain-http cluster is refused; with it, a login works.
    exc = _refusal(
        elastic_rendezvous.create_handler,
        _rdzv_params(endpoints, username=USER, password_file=str(password_file)),
    )
    assert isinstance(exc, ValueError) and "insecure_plaintext_credentials" in str(exc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        handler = elastic_rendezvous.create_handler(
            _rdzv_params(
                endpoints,
                username=USER,
                password_file=str(password_file),
                insecure_plaintext_credentials="1",
            )
        )
    assert not handler.is_closed()  # reads the state from etcd: needs the login
    assert SECRET not in caplog.text
