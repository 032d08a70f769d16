"""Which parameters a forward pass reached, found from the autograd graph (find_unused)."""

from __future__ import annotations

import torch
from torch import nn

from ferrodist.ddp.unused import find_tensors, reachable_parameters


class Branchy(nn.Module):
    """Shared, detached, unused and multi-output paths through one model."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(4, 4)
        self.left = nn.Linear(4, 2)
        self.right = nn.Linear(4, 2)
        self.detached = nn.Linear(4, 4)
        self.never = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor, use_right: bool) -> dict[str, object]:
        h = torch.relu(self.trunk(x)) * self.scale
        h = h + self.detached(x).detach()  # reached in forward, cut from the graph
        out: dict[str, object] = {"left": [self.left(h)], "note": "not a tensor"}
        if use_right:
            out["right"] = (self.right(h), self.trunk(h))  # trunk reused
        return out


def _grad_receivers(model: nn.Module, outputs: list[torch.Tensor]) -> set[int]:
    model.zero_grad(set_to_none=True)
    sum(o.sum() for o in outputs).backward()  # type: ignore[union-attr]
    return {id(p) for p in model.parameters() if p.grad is not None}


def test_the_reached_parameters_are_exactly_those_backward_gives_a_gradient() -> None:
    torch.manual_seed(0)
    model = Branchy()
    for use_right in (False, True):
        outputs = find_tensors(model(torch.randn(3, 4), use_right))
        reached = reachable_parameters(outputs)
        assert reached == _grad_receivers(model, outputs)
        names = {id(p): n for n, p in model.named_parameters()}
        assert {names[i] for i in reached if i in names} >= {"trunk.weight", "scale"}
        assert "never.weight" not in {names.get(i) for i in reached}
        assert ("right.weight" in {names.get(i) for i in reached}) == use_right


def test_outputs_without_a_graph_reach_nothing() -> None:
    assert reachable_parameters([torch.ones(2), torch.zeros(())]) == set()
