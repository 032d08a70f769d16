"""Run a functional optimizer inside DDP's communication hook, bucket by bucket.

Once a bucket's gradients are reduced, the parameters of that bucket are stepped right away
(``step_param``), overlapping the optimizer with the rest of the backward pass. The step runs in
a future callback and issues no collective, so it is safe on every backend, gloo included.
"""

from collections.abc import Callable, Iterable
from typing import Any, Optional

import torch
import torch.distributed as dist

__all__: list[str] = []

_STEP_METHOD = "step_param"


class _OptimizerHookState:
    """What the wrapped hook needs: a functional optimizer with ``step_param`` and, optionally,
    the only parameters it may update.

    Raises:
        ValueError: the optimizer has no ``step_param`` method.
    """

    __slots__ = ["functional_optimizer", "params_to_optimize"]

    def __init__(
        self, functional_optim: Any, params: Optional[Iterable[torch.Tensor]] = None
    ) -> None:
        self.functional_optimizer = functional_optim
        if not hasattr(functional_optim, _STEP_METHOD):
            raise ValueError(
                f"Class {type(functional_optim)} must implement method {_STEP_METHOD}."
            )
        if params is not None:
            self.params_to_optimize = set(params)


def _hook_then_optimizer(
    hook: Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]],
    optimizer_state: _OptimizerHookState,
) -> Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]:
    """Wrap ``hook`` so each bucket's parameters are stepped once its reduction completes."""
    restrict = hasattr(optimizer_state, "params_to_optimize")

    def hook_then_optimizer(
        hook_state: Any, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        reduced = hook(hook_state, bucket)

        def step(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            optimizer = optimizer_state.functional_optimizer
            for grad, param in zip(bucket.gradients(), bucket.parameters()):
                if not restrict or param in optimizer_state.params_to_optimize:
                    optimizer.step_param(param, grad)
            return bucket.buffer()

        return reduced.then(step)

    return hook_then_optimizer
