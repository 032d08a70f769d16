"""Ends a worker's torch process groups while the interpreter is still whole.

Why: a gloo group's C++ worker threads take the GIL to drop the tensors of a collective they
have completed. If the group lives into interpreter finalization (FSDP and DDP modules hold it
from reference cycles, and some torch modules bind ``group.WORLD`` as a default argument), such
a thread is ended mid-destructor and the process aborts with ``terminate called without an
active exception`` after its work is done (see ``ferrodist._group_release``). Workers that make
their groups with torch's own ``init_process_group`` call :func:`end_world` instead of
``destroy_process_group``, so every group is destroyed and its threads joined before exit.
"""

from __future__ import annotations

import gc

import torch.distributed as dist

from ferrodist._group_release import release_destroyed_defaults


def end_world() -> None:
    """Collect what holds the groups, destroy them, and collect again."""
    gc.collect()  # FSDP/DDP modules sit in reference cycles and hold their groups
    dist.destroy_process_group()
    release_destroyed_defaults()  # torch defaults bound to the dead WORLD group
    gc.collect()
