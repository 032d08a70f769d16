"""Finding the parameters a forward pass did not use (``find_unused_parameters=True``).

A parameter takes part in backward exactly when its gradient accumulator (an ``AccumulateGrad``
node, which holds the parameter as ``.variable``) is reachable from the outputs' ``grad_fn``.
Parameters that are not reachable never fire their hook, so the Reducer marks them ready up
front; otherwise their buckets would never be reduced and every rank would wait forever.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch


def find_tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside a (nested) forward output: tensors, lists, tuples, dicts."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in find_tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in find_tensors(item)]
    return []


def reachable_parameters(outputs: Iterable[torch.Tensor]) -> set[int]:
    """``id()`` of every leaf tensor whose accumulator is reachable from ``outputs``."""
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    seen: set[Any] = set()
    used: set[int] = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None:
            used.add(id(variable))
        stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
    return used
