"""Built-in flowcontrol plugins; `register` adds each class listed in BUILTINS (with its aliases)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .fairness import GlobalStrictFairnessPolicy, RoundRobinFairnessPolicy, WeightedFairFairnessPolicy
from .ordering import EdfOrderingPolicy, FcfsOrderingPolicy
from .program_aware import ProgramAwareFairnessPolicy
from .slo_deadline import SloDeadlineOrderingPolicy
from .usage_limit import StaticUsageLimitPolicy

if TYPE_CHECKING:
    from epp.framework.registry import Registry

BUILTINS: list[tuple[type, tuple[str, ...]]] = [
    (FcfsOrderingPolicy, ()),
    (EdfOrderingPolicy, ()),
    (SloDeadlineOrderingPolicy, ()),
    (GlobalStrictFairnessPolicy, ()),
    (RoundRobinFairnessPolicy, ()),
    (WeightedFairFairnessPolicy, ()),
    (ProgramAwareFairnessPolicy, ()),
    (StaticUsageLimitPolicy, ()),
]


def register(registry: Registry) -> None:
    """Register this group's plugin classes."""
    for cls, aliases in BUILTINS:
        registry.register(cls, aliases=aliases)
