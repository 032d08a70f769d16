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
    """``id()`` of every leaf tensor whose accumulator is reachable from ``outputs``.

    Runs every forward with ``find_unused_parameters`` over the whole graph (hundreds of nodes
    per layer stack), so it stays lean: a node is marked seen when first pushed, and only
    nodes with no successors (accumulators are such nodes) are asked for ``.variable``, a
    lookup that raises inside ``getattr`` on every other node type.
    """
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    seen: set[Any] = set(stack)
    used: set[int] = set()
    while stack:
        node = stack.pop()
        successors = node.next_functions
        if not successors:
            variable = getattr(node, "variable", None)
            if variable is not None:
                used.add(id(variable))
            continue
        for successor, _ in successors:
            if successor is not None and successor not in seen:
                seen.add(successor)
                stack.append(successor)
    return used
