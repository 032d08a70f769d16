"""Importing ferrodist defines names and changes nothing of torch's (issue 29, item 6).

What ferrodist must arrange with torch happens when it first matters, and is checked here in a
fresh interpreter each time: torch's store classes start counting ferrodist's instances with the
first ferrodist store, the keep-alive probe (``ferrodist.stores._lifetime``) runs then too, and
torch's ``tcp://`` / ``env://`` handlers learn to share a port when this process first serves
one. The one thing an import registers is the ``etcd://`` scheme, by name, through torch's
public ``register_rendezvous_handler``.
"""

from __future__ import annotations

import json
import os

from _procs import finish, spawn

import ferrodist

SNAPSHOT = """
import gc, json, socket
import torch.distributed as tdist
import importlib
torch_rdzv = importlib.import_module("torch.distributed.rendezvous")

def snapshot():
    handlers = torch_rdzv._rendezvous_handlers
    return {
        "metaclasses": [type(c).__name__ for c in
                        (tdist.TCPStore, tdist.PrefixStore, tdist.FileStore, tdist.HashStore)],
        "tcp": handlers["tcp"].__module__, "env": handlers["env"].__module__,
        "etcd": "etcd" in handlers,
        "gc_callbacks": len(gc.callbacks),
    }

states = {"before": snapshot()}
import ferrodist
states["imported"] = snapshot()
ours = ferrodist.HashStore()
states["first store"] = snapshot()
states["counts ours"] = isinstance(ours, tdist.HashStore)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
server = ferrodist.TCPStore("127.0.0.1", port, 1, True)
states["first server"] = snapshot()
print(json.dumps(states))
"""


def test_an_import_changes_nothing_of_torchs_until_a_store_or_server_needs_it() -> None:
    (out,) = finish([spawn(SNAPSHOT)])
    states = json.loads(out.strip().splitlines()[-1])
    before, imported = states["before"], states["imported"]
    assert before["metaclasses"] == ["pybind11_type"] * 4
    assert imported == {**before, "etcd": True}, "an import only registers etcd://"
    first_store = states["first store"]
    assert first_store["metaclasses"] == ["KinChecks"] * 4 and states["counts ours"]
    assert first_store["gc_callbacks"] == before["gc_callbacks"] + 1, "the keep-alive sweep"
    assert first_store["tcp"] == before["tcp"], "torch's handlers wait for a served port"
    served = states["first server"]
    assert served["tcp"] == served["env"] == "ferrodist.rdzv.api"


def test_the_package_root_shows_its_parts() -> None:
    """Stores and rendezvous live in their packages; the root re-exports their public names."""
    assert ferrodist.TCPStore is ferrodist.stores.TCPStore
    assert ferrodist.EtcdStore is ferrodist.stores.etcd.EtcdStore
    assert ferrodist.rendezvous is ferrodist.rdzv.api.rendezvous
    root = ferrodist.__path__[0]
    modules = sorted(
        name for name in os.listdir(root) if name.endswith(".py") and name != "__init__.py"
    )
    assert not [m for m in modules if "store" in m or "rendezvous" in m], modules
