"""The user's call site of a recorded op: the first frame outside ferrodist and torch.

Why this is more than a walk up the stack: FSDP's and DDP's ops are issued from hooks 15-20
frames below the user's line, and on Python 3.11 every frame walked is a frame object made on
the spot; on a model with hundreds of units that walk was most of the recorder's cost. Two kinds
of frame stay put while many ops are issued below them, so the rest of the walk from them is
found once and reused:

- a **scope** (``scope_of``): a frame that ferrodist's wrappers mark while they run, FSDP's
  ``forward`` of each unit. The walk from an op stops when it meets the innermost scope's frame,
  and takes the site that scope found (once) by walking on from its caller.
- the **autograd engine's entry** (``torch.autograd.graph._engine_run_backward``): every hook of
  a backward pass runs below it on the thread that called ``backward()``. What lies above it is
  the same for the whole pass, so it is found once per pass (torch's graph task id).

Both give exactly the site the whole walk would: a user frame below the marked frame is still
met first; only the part above it is reused, and that part cannot change while the frame runs.
ferrodist's own ops, issued right from a scope's frame or from an autograd hook with no user
frame in between, skip the walk down to the marked frame as well (``internal_call_site``): on a
model of small units that walk was still a fifth of what recording an op costs.
"""

from __future__ import annotations

import os
import sys
import threading
from types import CodeType, FrameType
from typing import Any, Optional

import torch
import torch.autograd.graph as _autograd_graph

__all__ = ["call_site", "internal_call_site", "scope_of"]

_FERRODIST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_INTERNAL_PREFIXES = (_FERRODIST_DIR, _TORCH_DIR)

_ENGINE_ENTRY: Optional[CodeType] = getattr(
    getattr(_autograd_graph, "_engine_run_backward", None), "__code__", None
)
"""The Python frame every backward pass runs its hooks below (torch 2.3 and later)."""

_graph_task_id = torch._C._current_graph_task_id

_user_file: dict[int, tuple[CodeType, Optional[str], dict[int, str]]] = {}
"""Per code object (by ``id``, with the object itself to tell a reused id apart): its file's
base name, or None for ferrodist's and torch's own code, and the sites found in it so far by
instruction offset (``f_lasti``). Keyed by id because hashing a code object hashes its
constants, nested code objects included, on every lookup; sites kept by offset because
``f_lineno`` scans the code's line table from its start, 2 µs an op from a loop at the end of a
400-line function (a training script's ``main``)."""

_outermost_file: dict[int, tuple[CodeType, str]] = {}
"""Per code object of an outermost internal frame (by ``id``, as above): its file, relative to
the package's parent."""


class _Marks(threading.local):
    """This thread's marked frames."""

    def __init__(self) -> None:
        self.scopes: list[list[Any]] = []
        """``[frame, site or None]`` per scope, innermost last; the site is found when first
        needed."""
        self.pass_id = -1
        """The backward pass whose site above the engine's entry is ``pass_site``."""
        self.pass_site = ""


_marks = _Marks()


def call_site(frame: Optional[FrameType] = None) -> str:
    """``file.py:line`` of the first frame outside ferrodist and torch (the user's call), or of
    the outermost frame when there is none (an op issued from an autograd hook thread); the walk
    starts at ``frame`` (default: the caller's), so that a wrapper that knows its own caller
    skips its own frames."""
    return _walk(frame or sys._getframe(1), len(_marks.scopes) - 1)


def internal_call_site(frame: FrameType) -> str:
    """``call_site(frame)`` for an op that ferrodist's own code issues (FSDP's gathers and
    reductions, DDP's buckets) from its scope's frame or from an autograd hook, so that no user
    frame lies between ``frame`` and the innermost scope or the engine's entry. In a forward:
    the innermost scope's site, found (once) by walking on from the scope's caller, never from
    ``frame``. In a backward: the running pass's site once known. Otherwise, and whenever a
    scope is open in a backward (a recomputed forward, whose frames may be the user's), the
    walk from ``frame``."""
    marks = _marks
    scopes = marks.scopes
    task = _graph_task_id()
    if task < 0:
        if scopes:  # the walk would meet the scope's frame first: start above it
            site = scopes[-1][1]
            return site if site is not None else _scope_site(len(scopes) - 1)
    elif not scopes and task == marks.pass_id:
        return marks.pass_site
    return _walk(frame, len(scopes) - 1)


def _walk(frame: FrameType, scope: int) -> str:
    """The site from ``frame`` up; ``scope``: the innermost scope that may still be met."""
    marks = _marks
    scope_frame = marks.scopes[scope][0] if scope >= 0 else None
    last = frame
    while frame is not None:
        if frame is scope_frame:
            return _scope_site(scope)
        code = frame.f_code
        known = _user_file.get(id(code))
        if known is None or known[0] is not code:
            known = (code, _user_name(code), {})
            _user_file[id(code)] = known
        if known[1] is not None:
            sites = known[2]
            site = sites.get(frame.f_lasti)
            if site is None:
                if len(sites) > 1000:  # a huge generated function: stay bounded
                    sites.clear()
                site = sites[frame.f_lasti] = f"{known[1]}:{frame.f_lineno}"
            return site
        if code is _ENGINE_ENTRY:
            return _above_engine(frame, scope)
        last = frame
        frame = frame.f_back  # type: ignore[assignment]
    return _outermost(last)


def _scope_site(scope: int) -> str:
    """The site of this thread's scope number ``scope``: found once, by walking on from its
    frame's caller."""
    entry = _marks.scopes[scope]
    if entry[1] is None:
        frame = entry[0]
        back = frame.f_back
        entry[1] = _walk(back, scope - 1) if back is not None else _outermost(frame)
    return entry[1]  # type: ignore[no-any-return]


def _above_engine(frame: FrameType, scope: int) -> str:
    task = _graph_task_id()
    marks = _marks
    if task >= 0 and task == marks.pass_id:
        return marks.pass_site
    back = frame.f_back
    site = _walk(back, scope) if back is not None else _outermost(frame)
    marks.pass_id, marks.pass_site = task, site
    return site


def _user_name(code: CodeType) -> Optional[str]:
    if len(_user_file) > 100_000:  # code made on the fly (exec): stay bounded
        _user_file.clear()
    if code.co_filename.startswith(_INTERNAL_PREFIXES):
        return None
    return os.path.basename(code.co_filename)


def _outermost(frame: FrameType) -> str:
    code = frame.f_code
    known = _outermost_file.get(id(code))
    if known is not None and known[0] is code:
        where = known[1]
    else:  # relpath costs microseconds; hooks on autograd's own threads land here on every op
        if len(_outermost_file) > 10_000:
            _outermost_file.clear()
        where = os.path.relpath(code.co_filename, os.path.dirname(_FERRODIST_DIR))
        _outermost_file[id(code)] = (code, where)
    return f"{where}:{frame.f_lineno}"


class scope_of:
    """``with scope_of(sys._getframe()):`` marks the calling frame as a scope (see the module
    doc) while the block runs. Cheap (a list push and pop), and nothing is walked unless an op
    is recorded inside."""

    __slots__ = ("_frame",)

    def __init__(self, frame: FrameType) -> None:
        self._frame = frame

    def __enter__(self) -> None:
        _marks.scopes.append([self._frame, None])

    def __exit__(self, *exc: object) -> None:
        scopes = _marks.scopes
        if scopes and scopes[-1][0] is self._frame:
            scopes.pop()
