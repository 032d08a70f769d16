"""The fenced code blocks of the project's documents, each with the way a reader runs it.

A README example that does not run is worse than none, so every fenced block in README.md and
benches/RESULTS.md carries, on the line right before its opening fence, a comment that says how
it is run (``tests/python/test_readme.py`` runs each one so):

    <!-- readme-test: RUNNER [ARG] [sub=OLD=>NEW ...] [expect=TEXT ...] -->

Runners: ``python`` (the block is a script, run with python), ``torchrun N`` (a script for N
processes, run as ``torchrun --standalone --nproc-per-node=N``), ``bash`` (typed into a shell,
run with ``bash -euo pipefail`` in a fresh directory), ``install`` (a bash block run in the
clone itself, with a fresh venv's ``pip``) and ``file NAME`` (saved as NAME for the blocks after
it in the same document, one of which must run it). ``sub`` replaces text before the run, in the
block and in the expectations, so what changes is visible next to the block: ``{port}`` is a
free port, ``{etcd}`` the endpoints of a running etcd cluster, ``{tmp}`` the run's directory.
``expect`` is text the output must contain. The values are shell words (quote them).

A block with no such line parses with ``runner`` None, and the test fails on it: a new example
gets a way to run, never a silent skip.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

DIRECTIVE = re.compile(r"^<!--\s*readme-test:(.*?)-->\s*$")
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
RUNNERS = {"python": 0, "torchrun": 1, "bash": 0, "install": 0, "file": 1}
PLACEHOLDERS = ("{port}", "{etcd}", "{tmp}")


class DirectiveError(ValueError):
    """A ``readme-test`` line that cannot be followed."""


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # the opening fence, 1-based
    lang: str
    text: str
    runner: Optional[str] = None
    arg: Optional[str] = None
    subs: tuple[tuple[str, str], ...] = ()
    expects: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.doc.name}:{self.line}:{self.runner or 'unmapped'}"


def parse_directive(body: str, where: str) -> dict[str, object]:
    """The parts of one directive's body (the text between ``readme-test:`` and ``-->``)."""
    try:
        words = shlex.split(body)
    except ValueError as e:
        raise DirectiveError(f"{where}: {e}") from None
    if not words or words[0] not in RUNNERS:
        raise DirectiveError(f"{where}: runner must be one of {sorted(RUNNERS)}, got {body!r}")
    runner, rest = words[0], words[1:]
    args = [w for w in rest if "=" not in w]
    if len(args) != RUNNERS[runner]:
        raise DirectiveError(f"{where}: {runner} takes {RUNNERS[runner]} argument(s): {body!r}")
    if runner == "torchrun" and not args[0].isdigit():
        raise DirectiveError(f"{where}: torchrun takes a process count, got {args[0]!r}")
    subs: list[tuple[str, str]] = []
    expects: list[str] = []
    for word in rest:
        if "=" not in word:
            continue
        key, value = word.split("=", 1)
        if key == "expect" and value:
            expects.append(value)
        elif key == "sub" and "=>" in value and value.split("=>", 1)[0]:
            old, new = value.split("=>", 1)
            unknown = set(re.findall(r"\{\w+\}", new)) - set(PLACEHOLDERS)
            if unknown:
                raise DirectiveError(f"{where}: unknown placeholder(s) {sorted(unknown)}")
            subs.append((old, new))
        else:
            raise DirectiveError(f"{where}: expected sub=OLD=>NEW or expect=TEXT, got {word!r}")
    return {
        "runner": runner,
        "arg": args[0] if args else None,
        "subs": tuple(subs),
        "expects": tuple(expects),
    }


def parse(doc: Path) -> list[Block]:
    """Every fenced block of ``doc``, in order, with the directive right above it (if any)."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    pending: Optional[tuple[int, dict[str, object]]] = None
    i = 0
    while i < len(lines):
        directive = DIRECTIVE.match(lines[i])
        if directive:
            where = f"{doc.name}:{i + 1}"
            if pending is not None:
                raise DirectiveError(f"{doc.name}:{pending[0]}: no code block follows it")
            pending = (i + 1, parse_directive(directive.group(1), where))
            i += 1
            continue
        fence = FENCE.match(lines[i])
        if not fence:
            if pending is not None and lines[i].strip():
                raise DirectiveError(f"{doc.name}:{pending[0]}: no code block right after it")
            i += 1
            continue
        marker, start = fence.group(1), i
        end = start + 1
        while end < len(lines) and not lines[end].startswith(marker[0] * len(marker)):
            end += 1
        if end == len(lines):
            raise DirectiveError(f"{doc.name}:{start + 1}: code block never closed")
        parts: dict[str, object] = {}
        if pending is not None:
            if pending[0] != start:  # the directive is the line right above the fence
                raise DirectiveError(f"{doc.name}:{pending[0]}: no code block right after it")
            parts = pending[1]
        blocks.append(
            Block(
                doc=doc,
                line=start + 1,
                lang=fence.group(2),
                text="\n".join(lines[start + 1 : end]) + "\n",
                **parts,  # type: ignore[arg-type]
            )
        )
        pending = None
        i = end + 1
    if pending is not None:
        raise DirectiveError(f"{doc.name}:{pending[0]}: no code block follows it")
    return blocks
