"""ZeRO's post-step parameter broadcasts overlapped with the next forward (opt-in).

``ZeroRedundancyOptimizer.overlap_with_forward(module)`` puts a forward pre-hook on every
submodule of ``module`` that directly holds parameters of the optimizer. ``step()`` then issues
the broadcasts asynchronously, in the modules' registration order (the same on every rank, so
the collectives match), and returns; each module's pre-hook waits only for the broadcasts that
carry its own parameters, as late as they are needed. Broadcasts of parameters no hooked module
holds (and bucket views that hold any such parameter) are still waited for inside ``step()``.

What is waited for is a handle per broadcast tensor (a parameter, or with
``parameters_as_bucket_view`` a rank's flat bucket), shared by every parameter it carries; a
handle is waited for at most once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["ForwardOverlap", "OverlapHandle"]


class _Pending:
    """One asynchronous broadcast, waited for at most once."""

    __slots__ = ("done", "work")

    def __init__(self, work: Any) -> None:
        self.work = work
        self.done = False

    def wait(self) -> None:
        if not self.done:
            self.done = True
            self.work.wait()


class ForwardOverlap:
    """The hooks on one module tree and the broadcasts they have not waited for yet."""

    def __init__(self, module: nn.Module, params: Iterable[torch.Tensor]) -> None:
        wanted = set(params)
        # Parameter -> position of the first module (registration order) that holds it.
        self.position: dict[torch.Tensor, int] = {}
        self._pending: dict[torch.Tensor, _Pending] = {}
        self._in_flight: list[_Pending] = []
        self._hooks: list[Any] = []
        for index, sub in enumerate(module.modules()):
            own = [p for p in sub._parameters.values() if p is not None and p in wanted]
            if not own:
                continue
            for p in own:
                self.position.setdefault(p, index)
            self._hooks.append(sub.register_forward_pre_hook(self._pre_hook(own), prepend=True))
        # Anything that reads every parameter at once before the per-module hooks run: DDP's
        # mixed precision (ferrodist's ``_mixed_precision``, torch's ``mixed_precision``) casts
        # the whole model first; all broadcasts finish before such a DDP's forward.
        for sub in module.modules():
            casts = getattr(sub, "_mixed_precision", None) or getattr(sub, "mixed_precision", None)
            if casts is not None and hasattr(sub, "module"):
                self._hooks.append(sub.register_forward_pre_hook(self._wait_all_hook, prepend=True))
        # ``module.state_dict()`` (also through a parent's) and ``load_state_dict`` see, or
        # overwrite, every parameter: all broadcasts finish first.
        self._hooks.append(module.register_state_dict_pre_hook(self._wait_all_hook))
        register_load = getattr(module, "register_load_state_dict_pre_hook", None)
        if register_load is not None:
            self._hooks.append(register_load(self._wait_all_hook))
        else:  # torch < 2.5: only the private name
            self._hooks.append(module._register_load_state_dict_pre_hook(self._wait_all_hook))

    def _wait_all_hook(self, *_: Any) -> None:
        self.wait_all()

    def _pre_hook(self, own: Sequence[torch.Tensor]) -> Any:
        def hook(_module: nn.Module, _args: Any) -> None:
            if not self._pending:
                return
            for p in own:
                pending = self._pending.pop(p, None)
                if pending is not None:
                    pending.wait()

        return hook

    def order(self, covered: list[torch.Tensor]) -> float:
        """Where a broadcast carrying ``covered`` goes in the issue order: unhooked first (they
        are waited for in ``step()``), then by the first module that needs it; an empty
        placeholder bucket last."""
        if not covered:
            return math.inf
        if any(p not in self.position for p in covered):
            return -1.0
        return float(min(self.position[p] for p in covered))

    def defer(self, work: Any, covered: list[torch.Tensor]) -> None:
        """Leave ``work`` in flight for the pre-hooks of the modules holding ``covered``."""
        pending = _Pending(work)
        self._in_flight.append(pending)
        for p in covered:
            self._pending[p] = pending

    def pending_params(self) -> set[torch.Tensor]:
        """The parameters whose broadcast no one has waited for yet (for tests)."""
        return {p for p, pending in self._pending.items() if not pending.done}

    def wait_all(self) -> None:
        """Wait for every broadcast still in flight, in issue order."""
        in_flight, self._in_flight = self._in_flight, []
        self._pending.clear()
        for pending in in_flight:
            pending.wait()

    def remove(self) -> None:
        self.wait_all()
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()


class OverlapHandle:
    """Returned by ``overlap_with_forward``; ``remove()`` waits for the broadcasts in flight and
    takes the hooks off, so ``step()`` is synchronous again."""

    def __init__(self, zero: Any, overlap: ForwardOverlap) -> None:
        self._zero = zero
        self._overlap = overlap

    def remove(self) -> None:
        if self._zero._forward_overlap is self._overlap:
            self._zero._forward_overlap = None
        self._overlap.remove()
