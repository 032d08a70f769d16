"""``ferrodist.fsdp``'s modules import one another in one direction: no cycle, no hidden import.

Why a test: the package once held a knot (most modules needed the wrapper class, which needed
them), kept working by imports inside functions, so nothing failed and nothing showed it. The
graph is read from the source with ``ast``: an edge is a module-level import of another fsdp
module. Imports under ``if TYPE_CHECKING:`` only feed annotations and never run, so they are
no edges. Imports inside a function or class are refused outright when they name ferrodist (the
way a cycle hides), and allowed for torch only where listed below with the reason.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Union

PACKAGE = "ferrodist.fsdp"

ALLOWED_NESTED: dict[tuple[str, str], str] = {}
"""(fsdp module, torch module it imports inside a function) -> why it cannot be imported at the
top: only for optional torch parts that some supported torch lacks. None today: every torch
part fsdp uses (DTensor included, see ``_torch_dtensor``) is loaded by ``torch.distributed.fsdp``
itself on torch 2.4 to 2.15, so importing it at the top costs nothing."""

Import = Union[ast.Import, ast.ImportFrom]


def _package_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


def _parse(directory: Path, package: str) -> dict[str, tuple[ast.Module, bool]]:
    """Module name -> (its syntax tree, whether it is the package's ``__init__``)."""
    out = {}
    for path in sorted(directory.glob("*.py")):
        is_init = path.stem == "__init__"
        name = package if is_init else f"{package}.{path.stem}"
        out[name] = (ast.parse(path.read_text(), filename=str(path)), is_init)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level(body: list[ast.stmt], skipped: list[Import]) -> list[Import]:
    """The imports that run when the module is imported; ``TYPE_CHECKING`` ones go to
    ``skipped``."""
    found: list[Import] = []
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            found.append(stmt)
        elif isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
            skipped.extend(_top_level(stmt.body, []))
            found.extend(_top_level(stmt.orelse, skipped))
        elif isinstance(stmt, ast.If):
            found.extend(_top_level(stmt.body + stmt.orelse, skipped))
        elif isinstance(stmt, ast.Try):
            handlers = [s for h in stmt.handlers for s in h.body]
            found.extend(_top_level(stmt.body + handlers + stmt.orelse + stmt.finalbody, skipped))
    return found


def _targets(module: str, is_init: bool, node: Import, known: set[str]) -> list[str]:
    """The absolute names of the modules ``node`` imports (a submodule where a name is one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        anchor = parts if is_init else parts[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def import_graph(directory: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports at module level (TYPE_CHECKING aside)."""
    modules = _parse(directory, package)
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, (tree, is_init) in modules.items():
        edges = set()
        for node in _top_level(tree.body, []):
            edges.update(t for t in _targets(name, is_init, node, known) if t in known)
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path that ends where it starts, or ``[]``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def nested_imports(directory: Path, package: str) -> list[str]:
    """Every import inside a function or class that is not allowed: ``module:line target``."""
    modules = _parse(directory, package)
    known = set(modules)
    bad = []
    for name, (tree, is_init) in modules.items():
        skipped: list[Import] = []
        top = {id(node) for node in _top_level(tree.body, skipped)}
        top.update(id(node) for node in skipped)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in top:
                continue
            for target in _targets(name, is_init, node, known):
                ours = isinstance(node, ast.ImportFrom) and node.level > 0
                ours = ours or target.split(".")[0] == "ferrodist"
                if ours or (name, target) not in ALLOWED_NESTED:
                    bad.append(f"{name}:{node.lineno} {target}")
    return bad


def test_fsdp_modules_import_without_a_cycle() -> None:
    graph = import_graph(_package_dir(), PACKAGE)
    # The graph is the real one: the wrapper sits on its parts.
    assert f"{PACKAGE}._runtime" in graph[f"{PACKAGE}._wrapper"]
    assert f"{PACKAGE}._state_dict" in graph[f"{PACKAGE}._wrapper"]
    assert find_cycle(graph) == [], " -> ".join(find_cycle(graph))


def test_fsdp_has_no_import_inside_a_function() -> None:
    bad = nested_imports(_package_dir(), PACKAGE)
    assert bad == [], "\n".join(bad)


def test_the_checks_see_cycles_and_nested_imports_and_skip_type_checking(tmp_path: Path) -> None:
    # A package with each shape the checks must tell apart.
    (tmp_path / "__init__.py").write_text("from .a import f\n")
    (tmp_path / "a.py").write_text(
        "from typing import TYPE_CHECKING\nfrom . import b\n"
        "if TYPE_CHECKING:\n    from .c import C\n"
        "def f():\n    from .c import g\n    import torch.distributed.tensor\n"
    )
    (tmp_path / "b.py").write_text("try:\n    from .c import g\nexcept ImportError:\n    pass\n")
    (tmp_path / "c.py").write_text("import pkg.b\nfrom pkg import a\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.c"},
        "pkg.c": {"pkg.a", "pkg.b"},
    }
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    assert find_cycle({"x": {"y"}, "y": set()}) == []
    assert nested_imports(tmp_path, "pkg") == ["pkg.a:6 pkg.c", "pkg.a:7 torch.distributed.tensor"]
