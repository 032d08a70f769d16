"""The wheel's build backend (scripts/wheel_backend.py): the ``ferrodist-store`` binary goes
into the wheel as a script with a correct RECORD line, so ``pip install`` puts the Rust binary
itself on PATH (no Python launcher, no torch import before serving); and the build runs a
protoc vendored from crates.io, so a source install needs no system protoc.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("maturin")
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
sys.path.insert(0, str(REPO / "scripts"))
import wheel_backend  # noqa: E402

DIST = "ferrodist-0.1.0"


def _wheel(tmp_path: Path) -> Path:
    wheel = tmp_path / f"{DIST}-cp39-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("ferrodist/__init__.py", "x = 1\n")
        z.writestr(f"{DIST}.dist-info/RECORD", "ferrodist/__init__.py,sha256=abc,6\n")
    return wheel


def _digest(payload: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(payload).digest()).rstrip(b"=").decode()


def test_add_script_puts_an_executable_with_its_record_line_in_the_wheel(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    exe = tmp_path / "ferrodist-store"
    exe.write_bytes(b"\x7fELF fake binary")
    wheel_backend.add_script(wheel, exe)
    wheel_backend.add_script(wheel, exe)  # idempotent: a rebuilt wheel gets one entry
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        script = f"{DIST}.data/scripts/ferrodist-store"
        assert names.count(script) == 1
        assert names[-1] == f"{DIST}.dist-info/RECORD", "RECORD stays last"
        info = z.getinfo(script)
        assert stat.S_IMODE(info.external_attr >> 16) == 0o755
        assert z.read(script) == exe.read_bytes()
        assert z.read("ferrodist/__init__.py") == b"x = 1\n"
        record = z.read(f"{DIST}.dist-info/RECORD").decode().splitlines()
    payload = exe.read_bytes()
    assert record == [
        "ferrodist/__init__.py,sha256=abc,6",
        f"{script},sha256={_digest(payload)},{len(payload)}",
    ]


def test_pyproject_builds_through_the_backend_and_has_no_python_launcher() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert config["build-system"]["build-backend"] == "wheel_backend"
    assert config["build-system"]["backend-path"] == ["scripts"]
    # A console script of the same name would shadow the binary with a Python process.
    assert "ferrodist-store" not in config["project"].get("scripts", {})


def _crate_dir(name: str) -> Path:
    meta = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    (package,) = [p for p in json.loads(meta.stdout)["packages"] if p["name"] == name]
    return Path(package["manifest_path"]).parent


def test_the_build_gets_a_vendored_protoc_that_compiles_etcds_protos(tmp_path: Path) -> None:
    env = wheel_backend.protoc_env({})
    protoc, include = Path(env["PROTOC"]), Path(env["PROTOC_INCLUDE"])
    # Not a system protoc: one shipped inside a crate, found without PATH.
    system = shutil.which("protoc")
    assert system is None or Path(system).resolve() != protoc.resolve()
    assert protoc.parent.parent.name.startswith("protoc-bin-vendored-"), protoc
    nothing = {"PATH": ""}  # the compiler and its includes must come from env alone
    version = subprocess.run(
        [protoc, "--version"], env=nothing, check=True, capture_output=True, text=True
    )
    assert version.stdout.startswith("libprotoc "), version.stdout
    # What etcd-client's build script asks of it: etcd's protos, which import protobuf's
    # well-known types (descriptor.proto, struct.proto), with only the vendored includes.
    proto = _crate_dir("etcd-client") / "proto"
    out = tmp_path / "etcd.pb"
    protos = sorted(p.relative_to(proto) for p in proto.rglob("*.proto"))
    subprocess.run(
        [protoc, "-I", proto, "-I", include, "--include_imports", "-o", out, *protos],
        env=nothing,
        cwd=tmp_path,
        check=True,
    )
    compiled = out.read_bytes()
    assert b"etcdserverpb" in compiled
    assert b"google/protobuf/descriptor.proto" in compiled


def test_a_protoc_the_builder_set_is_kept() -> None:
    # CARGO=false: the helper must not even run.
    assert wheel_backend.protoc_env({"PROTOC": "/opt/protoc", "CARGO": "false"}) == {}
    env = wheel_backend.protoc_env({"PROTOC_INCLUDE": "/opt/include"})
    assert "PROTOC_INCLUDE" not in env
    assert Path(env["PROTOC"]).is_file()


def test_a_helper_that_fails_says_how_to_build_anyway() -> None:
    with pytest.raises(RuntimeError, match="set PROTOC to a protoc binary"):
        wheel_backend.protoc_env({"CARGO": "false"})
    with pytest.raises(RuntimeError, match="set PROTOC to a protoc binary"):
        wheel_backend.protoc_env({"CARGO": "/nonexistent/cargo"})
