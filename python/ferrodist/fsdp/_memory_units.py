"""Which flat parameters torch's FSDP builds for a module, found without wrapping it.

torch wraps in post-order: every module the auto-wrap policy picks becomes an FSDP instance
that flattens its parameters not already taken by an instance wrapped before it (and not
ignored); the root instance takes the rest. Policy objects (``ModuleWrapPolicy``,
``CustomPolicy``) name their modules through ``_run_policy``; callables
(``size_based_auto_wrap_policy``) are asked the way torch's ``_recursive_wrap`` asks them. With
mixed precision, modules of ``MixedPrecision._module_classes_to_ignore`` are wrapped on their own
and run in full precision, as torch does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from torch import nn
from torch.distributed.fsdp import MixedPrecision
from torch.distributed.fsdp.wrap import _Policy


@dataclass(frozen=True)
class Unit:
    """The parameters one FSDP instance flattens, and its mixed-precision setting."""

    module_name: str
    params: tuple[nn.Parameter, ...]
    mixed_precision: MixedPrecision | None
    is_root: bool


def ignored_subtrees(ignored_modules: Iterable[nn.Module] | None) -> set[nn.Module]:
    """The ignored modules with their whole subtrees, as torch expands them."""
    if ignored_modules is None:
        return set()
    out: set[nn.Module] = set()
    for module in ignored_modules:
        if not isinstance(module, nn.Module):
            raise TypeError(f"ignored_modules must hold nn.Modules, got {type(module).__name__}")
        out.update(module.modules())
    return out


def flat_param_units(
    model: nn.Module,
    policy: _Policy | Callable[..., bool] | None,
    ignored: set[nn.Module],
    mixed_precision: MixedPrecision | None,
) -> list[Unit]:
    """The flat parameters torch builds, innermost wrapped module first and the root last.

    A wrapped module flattens its parameters not already taken by a module wrapped before it
    (torch wraps in post-order), skipping ignored ones; the root takes the rest.
    """
    ignored_params = {p for m in ignored for p in m.parameters()}
    mp_classes: tuple[type[nn.Module], ...] = (
        tuple(mixed_precision._module_classes_to_ignore) if mixed_precision is not None else ()
    )
    targets = _wrap_targets(model, policy, ignored, ignored_params, mp_classes)
    names = {module: name for name, module in model.named_modules()}
    taken: set[nn.Parameter] = set(ignored_params)
    units = []
    for module in [*targets, model]:
        params = tuple(p for p in module.parameters() if p not in taken)
        taken.update(params)
        if params:
            mp = None if isinstance(module, mp_classes) else mixed_precision
            units.append(Unit(names[module], params, mp, module is model))
    return units


def _wrap_targets(
    model: nn.Module,
    policy: _Policy | Callable[..., bool] | None,
    ignored: set[nn.Module],
    ignored_params: set[nn.Parameter],
    mp_classes: tuple[type[nn.Module], ...],
) -> list[nn.Module]:
    """The modules below the root that torch wraps, in its post-order."""
    if policy is None:
        return []
    if isinstance(policy, _Policy):
        chosen = set(policy._run_policy(model, ignored, {}))
        if mp_classes:
            chosen.update(
                m for m in model.modules() if m not in ignored and isinstance(m, mp_classes)
            )
        return [m for m in _post_order(model) if m in chosen and m is not model]
    if not callable(policy):
        raise TypeError(f"auto_wrap_policy must be a policy object or callable, got {policy!r}")
    if mp_classes:
        policy = functools.partial(_or_mp_classes, policy=policy, mp_classes=mp_classes)
    wrapped: list[nn.Module] = []
    _recursive_targets(model, policy, ignored, ignored_params, wrapped, only_children=True)
    return wrapped


def _or_mp_classes(
    *,
    module: nn.Module,
    recurse: bool,
    nonwrapped_numel: int,
    policy: Callable[..., bool],
    mp_classes: tuple[type[nn.Module], ...],
) -> bool:
    """torch's ``_or_policy`` of the user's policy and wrapping the mixed-precision-ignored
    module classes individually."""
    if policy(module=module, recurse=recurse, nonwrapped_numel=nonwrapped_numel):
        return True
    return recurse or isinstance(module, mp_classes)


def _recursive_targets(
    module: nn.Module,
    policy: Callable[..., bool],
    ignored: set[nn.Module],
    ignored_params: set[nn.Parameter],
    wrapped: list[nn.Module],
    only_children: bool = False,
) -> int:
    """torch's ``_recursive_wrap`` decisions for a callable policy, recording instead of
    wrapping. Returns the numel wrapped under ``module``."""
    numel = sum(p.numel() for p in module.parameters() if p not in ignored_params)
    if not policy(module=module, recurse=True, nonwrapped_numel=numel):
        return 0
    wrapped_numel = 0
    for child in module.children():
        if child not in ignored:
            wrapped_numel += _recursive_targets(child, policy, ignored, ignored_params, wrapped)
    if not only_children and policy(
        module=module, recurse=False, nonwrapped_numel=numel - wrapped_numel
    ):
        wrapped.append(module)
        return numel
    return wrapped_numel


def _post_order(root: nn.Module) -> list[nn.Module]:
    """Modules in the order torch's ``_post_order_apply`` visits them (each once)."""
    seen = {root}
    order: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if child not in seen:
                seen.add(child)
                visit(child)
        order.append(module)

    visit(root)
    return order
