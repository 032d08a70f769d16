"""``ferrodist-store --backend etcd://...`` and etcd credentials: the password comes from a file
or ``FERRODIST_ETCD_PASSWORD``, never from its argument list (``ps`` shows it to every user),
and never shows in its output, even at ``--log-level trace``; a password on the command line
is refused with a message that says where it goes instead; a user needs a password; plain
http needs ``--etcd-insecure-plaintext-credentials``. Against a real etcd cluster with auth."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as tdist
from etcd_auth import SECRET, USER, auth_cluster
from etcd_support import EtcdCluster
from tcp_support import ferrodist_store_command

pytestmark = pytest.mark.timeout(120)

ENV = "FERRODIST_ETCD_PASSWORD"


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    with auth_cluster() as started:
        yield started


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env.update(extra)
    return env


def _refused(*args: str, env: dict[str, str] | None = None) -> str:
    """The stderr of a ``ferrodist-store`` that must refuse to start."""
    run = subprocess.run(
        [*ferrodist_store_command(), "--host", "127.0.0.1", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env or _env(),
    )
    assert run.returncode != 0, run
    assert SECRET not in run.stdout + run.stderr, run.stderr
    return run.stderr


def test_a_password_on_the_command_line_is_refused_and_never_echoed(cluster: EtcdCluster) -> None:
    backend = f"etcd://{cluster.endpoints}/p"
    for args in (
        ("--backend", backend, "--etcd-username", USER, f"--etcd-password={SECRET}"),
        ("--backend", backend, "--etcd-username", USER, "--etcd-password", SECRET),
        ("--etcd-password", SECRET),
    ):
        err = _refused(*args)
        assert "--etcd-password is refused" in err and "--etcd-password-file" in err, err
        assert ENV in err, err
    err = _refused("--backend", f"etcd://{USER}:{SECRET}@{cluster.endpoints}/p")
    assert "--etcd-password-file" in err and "<redacted>" in err, err


def test_a_user_without_a_password_and_credentials_without_tls_are_refused(
    cluster: EtcdCluster, tmp_path: Path
) -> None:
    backend = ("--backend", f"etcd://{cluster.endpoints}/p")
    err = _refused(*backend, "--etcd-username", USER)
    assert "no password" in err and ENV in err, err
    empty = tmp_path / "empty"
    empty.write_text("")
    err = _refused(*backend, "--etcd-username", USER, "--etcd-password-file", str(empty))
    assert "no password" in err, err
    err = _refused(*backend, "--etcd-username", USER, env=_env(**{ENV: SECRET}))
    assert "without TLS" in err and "--etcd-insecure-plaintext-credentials" in err, err
    wrong = _refused(
        *backend, "--etcd-username", USER, "--etcd-insecure-plaintext-credentials",
        env=_env(**{ENV: SECRET + "-wrong"}),
    )  # fmt: skip
    assert "authentication failed" in wrong and SECRET + "-wrong" not in wrong, wrong


def test_a_server_logged_in_from_a_file_keeps_the_password_out_of_argv_and_logs(
    cluster: EtcdCluster, tmp_path: Path
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(SECRET + "\n")
    log = tmp_path / "stderr.log"
    with open(log, "w") as stderr:
        server = subprocess.Popen(
            [*ferrodist_store_command(), "--host", "127.0.0.1", "--port", "0",
             "--log-level", "trace", "--backend", f"etcd://{cluster.endpoints}/served",
             "--etcd-username", USER, "--etcd-password-file", str(password_file),
             "--etcd-insecure-plaintext-credentials"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=_env(),
        )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("ferrodist-store listening on "), log.read_text()[-2000:]
        port = int(line.strip().rsplit(":", 1)[1])
        argv = Path(f"/proc/{server.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert "--etcd-password-file" in argv and SECRET not in argv
        client = tdist.TCPStore(
            "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30),
            wait_for_workers=False,
        )  # fmt: skip
        client.set("k", "v")  # through the logged-in etcd connection
        assert client.get("k") == b"v"
    finally:
        server.kill()
        server.communicate(timeout=10)
    output = log.read_text()
    assert "without TLS" in output, output[-2000:]  # the warning insecure asked for
    assert SECRET not in output


def test_help_says_where_the_password_goes() -> None:
    run = subprocess.run(
        [*ferrodist_store_command(), "--help"], capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 0
    text = " ".join(run.stdout.split())
    assert "--etcd-password-file" in text and ENV in text
    assert "--etcd-insecure-plaintext-credentials" in text
    assert "There is no `--etcd-password`" in text
