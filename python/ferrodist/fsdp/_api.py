"""The installed torch's ``torch.distributed.fsdp`` names, as torch's own objects.

Why re-export rather than mirror: ``ShardingStrategy``, ``MixedPrecision``, the state-dict configs
and the FSDP2 API are data and functions that torch's FSDP, torch's checkpointing and users'
code compare by identity (``isinstance``, enum equality). Sharing the objects makes a config made
for torch's FSDP valid for ferrodist's and the other way round. The list is read from the
installed torch, so names a version lacks (the suite also runs on 2.4 and 2.11) are absent here
as they are there, and names a newer torch adds appear.
"""

from __future__ import annotations

from typing import Any

import torch.distributed.fsdp as _torch_fsdp

torch_all: tuple[str, ...] = tuple(_torch_fsdp.__all__)
"""The installed torch's ``torch.distributed.fsdp.__all__``: ferrodist.fsdp exports the same."""

torch_objects: dict[str, Any] = {
    name: getattr(_torch_fsdp, name) for name in torch_all if name != "FullyShardedDataParallel"
}
"""Every exported name but the FSDP class itself, mapped to torch's object."""
