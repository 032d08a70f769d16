"""``_register_comm_hook`` / ``_register_builtin_comm_hook``: torch's module-level entry points."""

from __future__ import annotations

import functools
import warnings
from typing import Any

from ferrodist.ddp import comm_hook
from ferrodist.ddp.reducer import Reducer


def _register_comm_hook(reducer: Reducer, state: Any, comm_hook_fn: Any) -> None:
    """Make ``comm_hook_fn(state, bucket)`` reduce every bucket of ``reducer``."""
    reducer._set_comm_hook(functools.partial(comm_hook_fn, state), "python")


def _register_builtin_comm_hook(reducer: Reducer, comm_hook_type: Any) -> None:
    """Use a built-in hook (ours or torch's ``BuiltinCommHookType``) on ``reducer``."""
    kind = comm_hook.resolve_builtin(comm_hook_type)
    if kind is None:
        warnings.warn(
            "Unknown built-in DDP comm hook type is provided. No comm hook will be used.",
            stacklevel=2,
        )
        return
    impl = {
        comm_hook.BuiltinCommHookType.ALLREDUCE: comm_hook.builtin_allreduce,
        comm_hook.BuiltinCommHookType.FP16_COMPRESS: comm_hook.builtin_fp16_compress,
    }[kind]
    reducer._set_comm_hook(functools.partial(impl, reducer._process_group), "builtin")
