"""``ShardedOptimizer``: a local optimizer over plain, ``ShardedTensor`` and ``DTensor`` params.

Like torch's ``torch.distributed._shard.sharded_optim.ShardedOptimizer`` it talks to no other
rank: each rank steps the shards it holds. Unlike torch's, ``state_dict``, ``load_state_dict``
and ``add_param_group`` work. The state dict is keyed by parameter *name* (torch's docstring
promises this, then raises ``NotImplementedError``), so a checkpoint does not depend on the
order parameters were registered in:

``{"state": {name: {...}}, "param_groups": [{<hyper-parameters>, "params": [names]}]}``

``DTensor`` parameters are handed to the inner optimizer as they are (``torch.optim`` steps them
shard-wise and keeps ``DTensor`` state, which distributed checkpointing saves); a
``ShardedTensor`` contributes each local shard's tensor under ``"<name>.local_shards.<i>"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.optim import Optimizer

__all__ = ["ShardedOptimizer"]


def _is_sharded_tensor(value: Any) -> bool:
    """True for the (deprecated) ``ShardedTensor``, which is itself a ``torch.Tensor`` subclass."""
    try:
        from torch.distributed._shard.sharded_tensor import ShardedTensor
    except ImportError:  # pragma: no cover - torch builds without distributed
        return False
    return isinstance(value, ShardedTensor)


def _flatten_named(named_params: Mapping[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """``(key, tensor)`` per tensor the optimizer steps, in the mapping's order."""
    flat: list[tuple[str, torch.Tensor]] = []
    for name, value in named_params.items():
        if _is_sharded_tensor(value):
            for i, shard in enumerate(value.local_shards()):
                flat.append((f"{name}.local_shards.{i}", shard.tensor))
        elif isinstance(value, torch.Tensor):
            flat.append((name, value))
        else:
            raise TypeError(
                f"named_params[{name!r}] must be a Tensor, DTensor or ShardedTensor, "
                f"got {type(value).__name__}"
            )
    return flat


class ShardedOptimizer(Optimizer):
    """Runs ``optimizer_class`` over the tensors this rank holds of ``named_params``.

    Args:
        named_params: parameter name -> ``Tensor``, ``DTensor`` or ``ShardedTensor``.
        optimizer_class: the optimizer to run locally (e.g. ``torch.optim.SGD``).
        *optimizer_args: positional arguments for ``optimizer_class``.
        **optimizer_kwargs: keyword arguments for ``optimizer_class``.

    Example::

        >>> opt = ShardedOptimizer(dict(model.named_parameters()), torch.optim.AdamW, lr=1e-3)
        >>> torch.save(opt.state_dict(), "optim.pt")  # keyed by parameter name
    """

    def __init__(
        self,
        named_params: Mapping[str, Any],
        optimizer_class: type[Optimizer],
        *optimizer_args: Any,
        **optimizer_kwargs: Any,
    ) -> None:
        flat = _flatten_named(named_params)
        self.named_params = named_params
        self._key_of: dict[int, str] = {id(t): k for k, t in flat}
        self._optim = optimizer_class([t for _, t in flat], *optimizer_args, **optimizer_kwargs)
        self.param_groups = self._optim.param_groups
        self.state = self._optim.state

    def zero_grad(self, set_to_none: bool = True) -> None:  # type: ignore[override]
        """Reset the gradients of every stepped tensor."""
        self._optim.zero_grad(set_to_none)

    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        """One optimizer step over the local tensors."""
        return self._optim.step(closure)

    def _key(self, param: torch.Tensor) -> str:
        return self._key_of[id(param)]

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state, with parameter names in place of indices."""
        inner = self._optim.state_dict()
        index_to_key: dict[int, str] = {}
        index = 0
        for group in self.param_groups:
            for param in group["params"]:
                index_to_key[index] = self._key(param)
                index += 1
        return {
            "state": {index_to_key[i]: v for i, v in inner["state"].items()},
            "param_groups": [
                {**g, "params": [index_to_key[i] for i in g["params"]]}
                for g in inner["param_groups"]
            ],
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a dict from :meth:`state_dict` (groups must list the same parameter names).

        Raises:
            ValueError: the groups or their parameter names do not match this optimizer's.
        """
        key_to_index: dict[str, int] = {}
        for group in self.param_groups:
            for param in group["params"]:
                key_to_index[self._key(param)] = len(key_to_index)
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for saved, current in zip(saved_groups, self.param_groups):
            if sorted(saved["params"]) != sorted(self._key(p) for p in current["params"]):
                raise ValueError(
                    "loaded state dict contains a parameter group that doesn't match the "
                    "parameter names of optimizer's group"
                )
        # Reorder each saved group to this optimizer's order, then load by index.
        groups = []
        for saved, current in zip(saved_groups, self.param_groups):
            groups.append(
                {**saved, "params": [key_to_index[self._key(p)] for p in current["params"]]}
            )
        state = {key_to_index[k]: v for k, v in state_dict["state"].items()}
        self._optim.load_state_dict({"state": state, "param_groups": groups})
        self.param_groups = self._optim.param_groups
        self.state = self._optim.state

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group whose ``"params"`` maps names to Tensors, DTensors or ShardedTensors.

        Raises:
            TypeError: ``"params"`` is not a mapping of names.
            ValueError: a name is already used.
        """
        if not hasattr(self, "_optim"):
            # Called by no constructor path, but keep Optimizer's contract.
            raise RuntimeError("ShardedOptimizer is not initialized")
        named = param_group.get("params")
        if not isinstance(named, Mapping):
            raise TypeError(
                "ShardedOptimizer.add_param_group: param_group['params'] must map parameter "
                "names to tensors"
            )
        flat = _flatten_named(named)
        for key, tensor in flat:
            if key in self._key_of.values():
                raise ValueError(f"parameter name {key!r} is already in the optimizer")
            self._key_of[id(tensor)] = key
        self._optim.add_param_group({**param_group, "params": [t for _, t in flat]})
