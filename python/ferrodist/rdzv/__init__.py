"""Rendezvous: from an ``init_method`` URL (or torchrun's settings) to a store every rank shares.

``join`` is what ``init_process_group`` runs (progress reports, a timeout that names the missing
ranks); ``api`` is torch's ``torch.distributed.rendezvous`` contract over ferrodist's stores;
``etcd_url`` reads ``etcd://`` URLs; ``elastic`` is the torchrun backend ``ferrodist-etcd``
(imported only by torchrun, through the entry point ``pyproject.toml`` declares).

Importing this package arranges two things with torch, both by name and neither touching what
torch already has: ``etcd://`` is registered in torch's dispatcher through its public
``register_rendezvous_handler`` (a scheme torch lacks; someone else's handler for it is kept),
and port sharing with torch RPC is set to start with this process's first store server.
"""

from __future__ import annotations

from ferrodist.rdzv.api import register_etcd_with_torch, rendezvous, share_ports_with_torch
from ferrodist.stores.tcp import when_serving

__all__ = ["register_etcd_with_torch", "rendezvous", "share_ports_with_torch"]

register_etcd_with_torch()
when_serving(share_ports_with_torch)
