"""The Python package's layer contracts (``[tool.importlinter]`` in pyproject.toml) can fail.

``./scripts/test`` runs ``lint-imports`` on the package in its lint step. These tests run it on
a temporary copy of the package: the copy as it is keeps every contract, and the copy with one
planted import breaks the contract that forbids it, with a report that names the import. They
also check the premise of the contracts' one broad exception: a module may import the package
root (``from ferrodist import ...``) only for the native extension or a submodule, since the
import graph cannot tell ``_native`` (no .py file) from the root, which imports everything.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "python" / "ferrodist"

ROOT_IMPORT_EXEMPT = {
    "demo.py": "the demo is a user's script (`import ferrodist as dist`), in the top layer",
}
"""Files that may import the package root itself, and why."""


def _lint_imports() -> Path:
    # requirements-dev.txt installs import-linter only on Python 3.11+, which it needs.
    pytest.importorskip("importlinter", reason="import-linter needs Python 3.11+")
    exe = Path(sys.executable).with_name("lint-imports")
    found = exe if exe.exists() else shutil.which("lint-imports")
    assert found, "lint-imports is missing: pip install -r requirements-dev.txt (import-linter)"
    return Path(found)


def _copy_package(tmp_path: Path) -> Path:
    """The package's .py sources and pyproject.toml under ``tmp_path``; returns the package dir."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    dest = tmp_path / "python" / "ferrodist"
    shutil.copytree(PACKAGE, dest, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return dest


def _run(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "python")}
    return subprocess.run(
        [str(_lint_imports()), "--no-cache", "--no-logo", "--config", "pyproject.toml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _plant(path: Path, line: str) -> None:
    """Appends ``line`` to the module, at module level: it becomes the file's last line."""
    path.write_text(path.read_text() + f"\n{line}  # planted by test_import_layers\n")


def test_the_package_as_it_is_keeps_every_contract(tmp_path: Path) -> None:
    _copy_package(tmp_path)
    result = _run(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "expected"),
    [
        # a store reaching up into DDP: the layers contract
        (
            "stores/base.py",
            "import ferrodist.ddp.reducer",
            "ferrodist.stores.base -> ferrodist.ddp.reducer",
        ),
        # the flight recorder reaching up into process groups
        (
            "debug/_describe.py",
            "import ferrodist.process_group",
            "ferrodist.debug._describe -> ferrodist.process_group",
        ),
        # two siblings of one layer that must stay independent
        (
            "stores/tcp.py",
            "import ferrodist.stores.file",
            "ferrodist.stores.tcp -> ferrodist.stores.file",
        ),
        # a cycle inside a subpackage: the acyclic contract (data_parallel imports reducer)
        (
            "ddp/reducer.py",
            "import ferrodist.ddp.data_parallel",
            "No cycles are allowed in ferrodist.ddp",
        ),
    ],
)
def test_a_planted_import_breaks_a_contract_and_is_named(
    tmp_path: Path, module: str, planted: str, expected: str
) -> None:
    package = _copy_package(tmp_path)
    _plant(package / module, planted)
    result = _run(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout
    assert expected in result.stdout, result.stdout


def test_a_new_top_level_module_must_be_given_a_layer(tmp_path: Path) -> None:
    package = _copy_package(tmp_path)
    (package / "unplaced.py").write_text('"""A module no layer names."""\n')
    result = _run(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "ferrodist.unplaced" in result.stdout, result.stdout


def _root_imports(package: Path) -> list[str]:
    """``file:line: text`` for each import of the package root that is neither ``_native`` nor
    a submodule (``import ferrodist`` or ``from ferrodist import <other name>``)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if str(rel) in ROOT_IMPORT_EXEMPT:
            continue
        depth = len(rel.parts) - 1  # how many packages below the root this file's package is
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [f"<module> as {a.asname}" for a in node.names if a.name == "ferrodist"]
            elif isinstance(node, ast.ImportFrom):
                is_root = (node.level == 0 and node.module == "ferrodist") or (
                    node.level == depth + 1 and node.module is None
                )
                if is_root:
                    names = [
                        a.name
                        for a in node.names
                        if a.name != "_native"
                        and not (package / a.name / "__init__.py").exists()
                        and not (package / f"{a.name}.py").exists()
                    ]
            if names:
                found.append(f"{rel}:{node.lineno}: {', '.join(names)}")
    return found


def test_the_package_root_is_imported_only_for_native_and_submodules() -> None:
    assert _root_imports(PACKAGE) == []


def test_the_root_import_check_can_fail(tmp_path: Path) -> None:
    package = _copy_package(tmp_path)
    _plant(package / "stores" / "base.py", "from ferrodist import init_process_group")
    _plant(package / "ddp" / "sink.py", "import ferrodist as dist")
    sink_line = len((package / "ddp" / "sink.py").read_text().splitlines())
    store_line = len((package / "stores" / "base.py").read_text().splitlines())
    assert _root_imports(package) == [
        f"ddp/sink.py:{sink_line}: <module> as dist",
        f"stores/base.py:{store_line}: init_process_group",
    ]
