"""The PEP 517 build backend: maturin, plus the ``ferrodist-store`` binary as a wheel script.

maturin builds the extension (``ferrodist._native``) but cannot put a Rust binary of the same
crate in the same wheel (PyO3/maturin#368). A Python console script was the fallback, and that
was the problem: it imported torch before serving (3-6 s, ~500 MB). So this backend lets
maturin build its wheel, then builds the binary with cargo (profile ``release``, without the
``python`` feature, so it never links libpython) and adds it to the wheel as
``ferrodist-<version>.data/scripts/ferrodist-store``, with its RECORD line: installers copy
such files into the environment's ``bin/`` as they are. Editable installs get it too.

Both builds compile the etcd-client crate, whose build script runs the ``protoc`` that
``$PROTOC`` names (prost-build). So that a source install needs no system protoc, the build
hooks first set ``PROTOC`` and ``PROTOC_INCLUDE`` to a protoc vendored from crates.io, as printed
by the build helper ``rust/protoc`` (a crate of its own: it compiles in seconds and needs no
protoc), unless ``PROTOC`` is set already.

Every other hook (sdist, metadata, requirements) is maturin's own. A plain ``maturin build``
bypasses this file and gives a wheel without the server; build wheels with ``pip wheel .``
(or ``python -m build``), which go through it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import maturin
from maturin import (  # noqa: F401 (PEP 517 hooks taken from maturin as they are)
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

BINARY = "ferrodist-store"
PROTOC_HELPER = Path(__file__).resolve().parents[1] / "rust" / "protoc" / "Cargo.toml"


def protoc_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to ``environ`` so the build runs the vendored protoc.

    Empty when ``environ`` sets ``PROTOC`` (the builder's own protoc wins, as in prost-build);
    otherwise ``PROTOC`` and, unless set, ``PROTOC_INCLUDE``, as printed by the helper.
    """
    if environ.get("PROTOC"):
        return {}
    cargo = environ.get("CARGO", "cargo")
    command = [cargo, "run", "-q", "--locked", "--manifest-path", str(PROTOC_HELPER)]
    try:
        # stderr is the builder's: cargo's reason, if it fails, shows there.
        printed = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise RuntimeError(
            f"`{' '.join(command)}` (finds the protoc vendored from crates.io) failed: {err}; "
            "set PROTOC to a protoc binary to build with that one instead"
        ) from err
    found = dict(line.split("=", 1) for line in printed.splitlines() if "=" in line)
    if "PROTOC" not in found:
        raise RuntimeError(f"`{' '.join(command)}` printed no PROTOC=...: {printed!r}")
    return {
        name: value
        for name, value in found.items()
        if name in ("PROTOC", "PROTOC_INCLUDE") and not environ.get(name)
    }


def _build_binary() -> Path:
    """Builds ``ferrodist-store`` with cargo and returns its path."""
    cargo = os.environ.get("CARGO", "cargo")
    command = [cargo, "build", "--release", "--bin", BINARY]
    print(f"Running `{' '.join(command)}`", flush=True)
    subprocess.run(command, check=True, stdout=sys.stderr)
    meta = subprocess.run(
        [cargo, "metadata", "--no-deps", "--format-version", "1"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(json.loads(meta.stdout)["target_directory"]) / "release" / BINARY


def _record_line(path: str, payload: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(payload).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(payload)}\n"


def add_script(wheel: Path, executable: Path) -> None:
    """Adds ``executable`` to ``wheel`` as a script (installed into ``bin/``), in place."""
    name, version = wheel.name.split("-")[:2]
    script = f"{name}-{version}.data/scripts/{executable.name}"
    record_name = f"{name}-{version}.dist-info/RECORD"
    payload = executable.read_bytes()
    rewritten = wheel.with_name(wheel.name + ".part")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(rewritten, "w") as dst:
        record_info = src.getinfo(record_name)
        for item in src.infolist():
            if item.filename not in (record_name, script):
                dst.writestr(item, src.read(item))
        entry = zipfile.ZipInfo(script, date_time=record_info.date_time)
        entry.external_attr = (stat.S_IFREG | 0o755) << 16
        entry.compress_type = zipfile.ZIP_DEFLATED
        dst.writestr(entry, payload)
        record = src.read(record_info).decode()
        kept = [line for line in record.splitlines(keepends=True) if line.split(",")[0] != script]
        dst.writestr(record_info, "".join(kept) + _record_line(script, payload))
    rewritten.replace(wheel)


def _with_binary(wheel_directory: str, build: Callable[[], str]) -> str:
    os.environ.update(protoc_env(os.environ))  # inherited by maturin, cargo, build scripts
    filename = build()
    add_script(Path(wheel_directory) / filename, _build_binary())
    return filename


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """PEP 517 ``build_wheel``: maturin's wheel with ``ferrodist-store`` in its scripts."""
    return _with_binary(
        wheel_directory,
        lambda: maturin.build_wheel(wheel_directory, config_settings, metadata_directory),
    )


def build_editable(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """PEP 660 ``build_editable``: as :func:`build_wheel`, for ``pip install -e .``."""
    return _with_binary(
        wheel_directory,
        lambda: maturin.build_editable(wheel_directory, config_settings, metadata_directory),
    )
