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
back to the kin class. ferrodist's classes are defined with it; torch's receive it when the
first ferrodist store is made (``pair_torch_classes``), so importing ferrodist leaves torch's
classes as they are. Nothing else changes: not ``type()``, the method resolution order, or
what torch's C++ accepts (pybind11 checks real subtypes), and a subclass of either class keeps
the ordinary checks. The price is a Python-level check when an instance is not of the class
itself; torch's own code checks none of these classes.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as _tdist

__all__ = ["KinChecks", "kin", "pair_torch_classes"]

_PybindType: type = type(_tdist.Store)

_KIN: dict[type, type] = {}
"""Each paired class -> the class it counts as its own (ferrodist's <-> torch's)."""

_torch_classes_paired: bool | None = None
"""None until the first ferrodist store is made; then whether torch's classes were paired."""


class KinChecks(_PybindType):  # type: ignore[misc, valid-type]
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


def kin(ours: KinChecks, theirs: type) -> None:
    """Names ``theirs`` (torch's class) as the kin of ``ours`` (a ferrodist class whose metaclass
    is ``KinChecks``): ``ours`` counts torch's instances from now on, and torch's class counts
    ferrodist's once ``pair_torch_classes`` has run."""
    _KIN[ours], _KIN[theirs] = theirs, ours


def pair_torch_classes() -> bool:
    """Gives torch's kin classes the ``KinChecks`` metaclass, once; run when the first ferrodist
    store is made (before that no ferrodist instance exists for torch's checks to count), so that
    importing ferrodist changes nothing of torch's.

    Returns:
        Whether torch's classes are paired: False, and nothing changed, where one's metaclass is
        not pybind11's (a torch whose store classes are built another way). Making a store must
        not fail over it; ``tests/python/test_default_group_store.py`` checks the pairing.
    """
    global _torch_classes_paired
    if _torch_classes_paired is None:
        theirs = [cls for cls in _KIN if type(cls) is not KinChecks]
        if all(type(cls) is _PybindType for cls in theirs):
            for cls in theirs:
                cls.__class__ = KinChecks
            _torch_classes_paired = True
        else:
            _torch_classes_paired = False
    return _torch_classes_paired
