"""Keeps a ferrodist store alive for as long as torch's C++ code still uses it.

ferrodist's stores are Python subclasses of ``torch.distributed.Store``. When torch takes one
(``init_process_group(store=...)``, ``torch.distributed.PrefixStore(...)``, ``new_group()``) it
keeps a C++ reference to the C++ half of the object, but not to the Python half that holds our
methods. If the caller drops its last Python reference (``init_process_group(store=FileStore(
...))``), Python frees that half, and every later call from torch fails with
``INTERNAL ASSERT FAILED ... Not implemented`` (torch issue #120843; ``new_group()`` is where it
usually shows).

The fix: when the Python half is about to be freed (``__del__``), we read the C++ reference
count; if torch still holds the object we resurrect it into ``_pinned``. A sweep, run after each
garbage collection, releases pinned stores once torch has let go (e.g. after
``destroy_process_group()``), so a ``FileStore`` is still cleaned up when torch would clean up
its own.

Reading the count relies on pybind11's instance layout and c10's reference count word, foreign
memory read through ctypes: a wrong guess there is a crash, not an exception. So the read is
made only on torch releases whose layout our tests pin (``_LAYOUT_TESTED``; add a release once
``tests/python/test_store_interop.py`` passes on it), on a 64-bit CPython with the GIL, and even
then only after a probe store shows the count moving as torch takes and drops it. Anywhere
else nothing is read: a store whose Python half is dropped is kept for the life of the process
instead (always safe, but the file of such a ``FileStore`` then stays until exit).
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import sys
import sysconfig
from typing import Any, Optional

import torch
import torch.distributed as _tdist

__all__ = ["keep_alive_while_shared", "prepare"]

# Offset of the C++ value pointer in a pybind11 instance: just after PyObject_HEAD.
_VALUE_OFFSET = object.__basicsize__
# c10::intrusive_ptr_target: a vtable pointer, then the combined count word whose low 32 bits
# are the strong count.
_COUNT_OFFSET = ctypes.sizeof(ctypes.c_void_p)

# torch releases (major, minor) on which the layout above is tested: test_store_interop.py and
# the FileStore clean-up tests passed on 2.4.1, 2.11.0, 2.13.0 and 2.15.0 reading it.
_LAYOUT_TESTED = frozenset({(2, 4), (2, 11), (2, 13), (2, 15)})

_pinned: set[Any] = set()
_layout_checked: Optional[bool] = None
_prepared = False


def _torch_release() -> Optional[tuple[int, int]]:
    """``(major, minor)`` of the installed torch, None when its version does not parse."""
    parts = torch.__version__.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _layout_trusted() -> bool:
    """True where reading torch's object memory is known to be safe (see the module doc)."""
    return (
        _torch_release() in _LAYOUT_TESTED
        and sys.implementation.name == "cpython"
        and ctypes.sizeof(ctypes.c_void_p) == 8
        and not sysconfig.get_config_var("Py_GIL_DISABLED")
    )


def _strong_count(obj: object) -> Optional[int]:
    """The C++ strong reference count of a torch store object, or None if it has no C++ half."""
    value = ctypes.c_void_p.from_address(id(obj) + _VALUE_OFFSET).value
    if not value:
        return None
    return ctypes.c_uint64.from_address(value + _COUNT_OFFSET).value & 0xFFFFFFFF


class _Probe(_tdist.Store):
    pass


def _layout_ok() -> bool:
    """Checks once that the count we read moves as torch takes and drops references."""
    global _layout_checked
    if _layout_checked is None and not _layout_trusted():
        _layout_checked = False
    if _layout_checked is None:
        try:
            probe = _Probe()
            alone = _strong_count(probe)
            held = _tdist.PrefixStore("probe", probe)
            shared = _strong_count(probe)
            del held
            _layout_checked = (alone, shared, _strong_count(probe)) == (1, 2, 1)
        except Exception:  # any surprise means: do not trust the layout
            _layout_checked = False
    return _layout_checked


def keep_alive_while_shared(store: object) -> None:
    """Called from a store's ``__del__``: resurrects it if torch's C++ code still holds it."""
    if sys.is_finalizing():
        return
    if not _layout_ok():
        _pinned.add(store)  # nothing may be read: keep it, torch may hold it
        return
    count = _strong_count(store)
    if count is not None and count > 1:
        _pinned.add(store)


def _sweep(phase: str, info: dict[str, int]) -> None:
    """Releases pinned stores that torch no longer holds (runs after each collection)."""
    if phase != "stop" or not _pinned or not _layout_checked:
        return
    for store in list(_pinned):
        count = _strong_count(store)
        if count is None or count <= 1:
            _pinned.discard(store)


def prepare() -> None:
    """Run as each store is made (a flag test after the first): probes the layout once, so that
    no ``__del__`` ever builds the probe, and starts the sweep. Nothing runs at import."""
    global _prepared
    if _prepared:
        return
    _prepared = True
    _layout_ok()  # a few microseconds
    gc.callbacks.append(_sweep)
    # At exit, let go as an ordinary Python reference would be let go, so files get cleaned up.
    atexit.register(_pinned.clear)
