"""The shipped type stub must describe the extension module exactly."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import ferrodist
from ferrodist import _native

STUB = Path(ferrodist.__file__).with_name("_native.pyi")


def _stub_names() -> dict[str, set[str]]:
    """Top-level names of the stub, each class mapped to its member names."""
    tree = ast.parse(STUB.read_text())
    names: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = {
                n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            } | {
                n.target.id
                for n in node.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            }
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = set()
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
    return {k: v for k, v in names.items() if not k.startswith("_") or k == "__version__"}


def _module_names() -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for name, obj in vars(_native).items():
        if name.startswith("_") and name != "__version__":
            continue
        if inspect.isclass(obj):
            names[name] = {
                m for m in vars(obj) if not m.startswith("_") or m in ("__init__", "__new__")
            }
        else:
            names[name] = set()
    return names


def test_stub_lists_the_same_top_level_names_as_the_module() -> None:
    assert set(_stub_names()) == set(_module_names())


def test_stub_lists_the_same_members_for_every_class() -> None:
    stub, module = _stub_names(), _module_names()
    for name in module.keys() & stub.keys():
        public_stub = {m for m in stub[name] if not m.startswith("_")}
        public_module = {m for m in module[name] if not m.startswith("_")}
        assert public_stub == public_module, name


def test_package_ships_py_typed() -> None:
    assert Path(ferrodist.__file__).with_name("py.typed").exists()
