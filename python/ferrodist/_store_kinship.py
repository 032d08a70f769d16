"""``isinstance`` answers across ferrodist's store classes and torch's, in both directions.

Why: torch always wraps a process group's store in its own ``PrefixStore`` (a group's name, the
default group's ``"default_pg"``), so with ``import ferrodist as dist`` the store a script reads
back from a group (``distributed_c10d._get_process_group_store(group)``) is torch's
``PrefixStore`` around ferrodist's, and ``isinstance(store, dist.PrefixStore)`` was False for
torch's layer; the other way, with ``torch.distributed`` names, the ferrodist ``TCPStore`` under
a group that ferrodist's rendezvous (or a port it serves) made was not a ``dist.TCPStore``.
Code that walks ``underlying_store`` while the store is a ``PrefixStore`` and then checks for a
``TCPStore`` (torch's own tests do, to read ``libuvBackend``) stopped at the first layer.

So each ferrodist store class and the torch class it mirrors (``TCPStore``, ``PrefixStore``,
``FileStore``, ``HashStore``) count each other's instances, and each other as subclasses: both
get a metaclass (a subclass of pybind11's, which torch's store classes have) whose checks fall
back to the kin class. Nothing else changes: not ``type()``, the method resolution order, or
what torch's C++ accepts (pybind11 checks real subtypes), and a subclass of either class keeps
the ordinary checks. The price is a Python-level check when an instance is not of the class
itself; torch's own code checks none of these classes.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as _tdist

__all__ = ["pair_store_classes", "pair_with_torch"]

_PybindType: type = type(_tdist.Store)

_KIN: dict[type, type] = {}
"""Each paired class -> the class it counts as its own (ferrodist's <-> torch's)."""


class _KinChecks(_PybindType):  # type: ignore[misc, valid-type]
    """Metaclass of the paired store classes: an instance or subclass of the kin class counts."""

    def __instancecheck__(cls, instance: Any) -> bool:
        if type.__instancecheck__(cls, instance):
            return True
        kin = _KIN.get(cls)
        return kin is not None and type.__instancecheck__(kin, instance)

    def __subclasscheck__(cls, subclass: type) -> bool:
        if type.__subclasscheck__(cls, subclass):
            return True
        kin = _KIN.get(cls)
        return kin is not None and type.__subclasscheck__(kin, subclass)


def pair_store_classes(pairs: tuple[tuple[type, type], ...]) -> bool:
    """Make each ``(ours, torch's)`` pair count each other's instances and subclasses.

    Run once at import; running it again changes nothing.

    Returns:
        Whether the classes are paired: False, and nothing changed, where a class's metaclass
        is not pybind11's (a torch whose store classes are built another way). Importing
        ferrodist must not fail over it; ``tests/python/test_default_group_store.py`` does.
    """
    classes = [cls for pair in pairs for cls in pair]
    if any(type(cls) not in (_PybindType, _KinChecks) for cls in classes):
        return False
    for ours, theirs in pairs:
        _KIN[ours], _KIN[theirs] = theirs, ours
    for cls in classes:
        cls.__class__ = _KinChecks
    return True


def pair_with_torch() -> bool:
    """Pair ferrodist's ``TCPStore``, ``PrefixStore``, ``FileStore`` and ``HashStore`` with
    torch's (see ``pair_store_classes``)."""
    from ferrodist.file_store import FileStore
    from ferrodist.prefix_store import PrefixStore
    from ferrodist.store import HashStore
    from ferrodist.tcp_store import TCPStore

    return pair_store_classes(
        (
            (TCPStore, _tdist.TCPStore),
            (PrefixStore, _tdist.PrefixStore),
            (FileStore, _tdist.FileStore),
            (HashStore, _tdist.HashStore),
        )
    )
