"""Every code block of README.md and benches/RESULTS.md runs as the text around it says.

A newcomer copies the README's examples first; one that fails (an undefined ``rank``, a store
that blocks 30 s) costs the project that user. So each fenced block is run the way its
``readme-test`` line says (see ``doc_blocks``): scripts with python or torchrun, shell blocks
with bash in a fresh directory where ``ferrodist-store`` and the venv are on PATH, the install
blocks in the clone with a fresh venv, and the run must exit 0 and print what the text
promises. Ports, etcd endpoints and directories that a reader would pick are substituted as the
block's line says; nothing else changes. Every process a block starts runs in its own session
and is killed at the end; a block that leaves one behind fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Optional

import doc_blocks
import pytest
from _procs import PACKAGE_ROOT
from doc_blocks import Block

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "benches" / "RESULTS.md"]
BLOCKS = [block for doc in DOCS for block in doc_blocks.parse(doc)]
RUN_TIMEOUT_S = 240.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _substitutions(block: Block, tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    out = {}
    for old, new in block.subs:
        if "{port}" in new:
            new = new.replace("{port}", str(_free_port()))
        if "{etcd}" in new:
            new = new.replace("{etcd}", request.getfixturevalue("etcd_cluster").endpoints)
        out[old] = new.replace("{tmp}", str(tmp))
    return out


def _apply(text: str, subs: dict[str, str]) -> str:
    for old, new in subs.items():
        assert old in text, f"sub={old!r}: not in the text it should replace"
        text = text.replace(old, new)
    return text


def _env(path_first: list[str], pythonpath: Optional[str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([*path_first, env.get("PATH", "")])
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    for leftover in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(leftover, None)
    return env


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Runs ``command`` in a session of its own; kills whatever of it is left at the end."""
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"still running after {RUN_TIMEOUT_S:.0f} s:\n{out[-4000:]}")
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return proc.returncode, out
    pytest.fail(f"the block left a process running (killed now):\n{out[-4000:]}")


def _files_before(block: Block) -> dict[str, str]:
    """The ``file`` blocks above ``block`` in its document, by name."""
    return {
        b.arg: b.text
        for b in BLOCKS
        if b.doc == block.doc and b.line < block.line and b.runner == "file" and b.arg
    }


def _check_file_block(block: Block) -> None:
    assert block.arg
    if block.lang == "python":
        compile(block.text, block.arg, "exec")
    users = [
        b
        for b in BLOCKS
        if b.doc == block.doc and b.line > block.line and b.runner not in (None, "file")
    ]
    assert any(block.arg in b.text for b in users), (
        f"{block.name}: no block after it runs {block.arg}, so it is never run"
    )


def _install(block: Block, tmp: Path, script: Path) -> tuple[int, str]:
    """Runs an install block in the clone with a fresh venv's pip first on PATH. The venv sees
    this venv's packages (a .pth file), so pip finds torch installed instead of downloading it;
    it must end up with ferrodist importable from its own site-packages and the
    ``ferrodist-store`` binary in its ``bin/``."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "_readme_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = _env([str(venv / "bin")], None)
    env["VIRTUAL_ENV"] = str(venv)
    dist = REPO / "dist"
    before = set(dist.glob("*")) if dist.exists() else None
    try:
        code, out = _run(["bash", "-euo", "pipefail", str(script)], REPO, env)
    finally:
        if before is None:
            shutil.rmtree(dist, ignore_errors=True)
        else:
            for made in set(dist.glob("*")) - before:
                made.unlink()
    if code != 0:
        return code, out
    where = subprocess.run(
        [str(py), "-c", "import ferrodist._native, ferrodist; print(ferrodist.__file__)"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    server = venv / "bin" / "ferrodist-store"
    assert server.read_bytes()[:4] == b"\x7fELF", "ferrodist-store is not the Rust binary"
    version = subprocess.run([str(server), "--version"], capture_output=True, text=True)
    assert version.returncode == 0, version.stderr
    return code, out


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_block_runs_as_its_text_says(
    block: Block, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    assert block.runner is not None, (
        f"{block.name}: no '<!-- readme-test: RUNNER ... -->' line right above this block; "
        "say how a reader runs it (tests/python/doc_blocks.py lists the runners)"
    )
    if block.runner == "file":
        _check_file_block(block)
        return
    subs = _substitutions(block, tmp_path, request)
    for name, text in _files_before(block).items():
        (tmp_path / name).write_text(text)
    suffix = ".py" if block.runner in ("python", "torchrun") else ".sh"
    script = tmp_path / f"block{suffix}"
    script.write_text(_apply(block.text, subs))
    store_bin = shutil.which("ferrodist-store")
    assert store_bin, "ferrodist-store is not on PATH (scripts/_setup.sh puts it there)"
    env = _env([str(Path(store_bin).parent), str(Path(sys.executable).parent)], PACKAGE_ROOT)
    if block.runner == "python":
        code, out = _run([sys.executable, script.name], tmp_path, env)
    elif block.runner == "torchrun":
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        code, out = _run([*launch, f"--nproc-per-node={block.arg}", script.name], tmp_path, env)
    elif block.runner == "bash":
        code, out = _run(["bash", "-euo", "pipefail", script.name], tmp_path, env)
    else:
        code, out = _install(block, tmp_path, script)
    assert code == 0, f"{block.name} exited {code}:\n{out[-6000:]}"
    for expected in block.expects:
        expected = _apply(expected, {o: n for o, n in subs.items() if o in expected})
        assert expected in out, f"{block.name}: {expected!r} not in its output:\n{out[-6000:]}"


def test_the_documents_have_blocks_and_each_directive_is_checked(tmp_path: Path) -> None:
    """The parser finds the README's blocks, and a block without a directive (or a directive
    without a block, or one it cannot follow) is reported rather than passed over."""
    assert len([b for b in BLOCKS if b.doc.name == "README.md"]) >= 10
    doc = tmp_path / "doc.md"
    doc.write_text("text\n\n```python\nprint(1)\n```\n")
    (unmapped,) = doc_blocks.parse(doc)
    assert unmapped.runner is None and unmapped.text == "print(1)\n"
    for bad in (
        "<!-- readme-test: python -->\n\nno block here\n",
        "<!-- readme-test: python -->\n",
        "<!-- readme-test: perl -->\n```perl\n```\n",
        "<!-- readme-test: torchrun two -->\n```python\n```\n",
        "<!-- readme-test: bash sub=1=>{nope} -->\n```bash\n```\n",
        "<!-- readme-test: bash colour=red -->\n```bash\n```\n",
        "<!-- readme-test: python -->\n```python\nnever closed\n",
    ):
        doc.write_text(bad)
        with pytest.raises(doc_blocks.DirectiveError):
            doc_blocks.parse(doc)
    doc.write_text(
        '<!-- readme-test: torchrun 2 sub=29500=>{port} expect="a b" -->\n```python\nx\n```\n'
    )
    (mapped,) = doc_blocks.parse(doc)
    assert (mapped.runner, mapped.arg, mapped.subs, mapped.expects) == (
        "torchrun",
        "2",
        (("29500", "{port}"),),
        ("a b",),
    )
