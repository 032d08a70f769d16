"""torch's ``DTensor``, ``Replicate`` and ``Shard``, from wherever the installed torch has them.

Why a module: torch 2.5 made them public under ``torch.distributed.tensor``; torch 2.4 has a
``torch.distributed.tensor`` package without them and keeps them under
``torch.distributed._tensor``. Every DTensor check and every SHARDED state dict with a device mesh
goes through these names, so the fallback is written once, here. Both modules are loaded by
``torch.distributed.fsdp`` itself, so importing them costs nothing.
"""

from __future__ import annotations

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # torch 2.4: only the private path has them
    from torch.distributed._tensor import (  # type: ignore[no-redef,assignment]
        DTensor,
        Replicate,
        Shard,
    )

__all__ = ["DTensor", "Replicate", "Shard"]
