"""Built-in pickers plugins; `register` adds each class listed in BUILTINS (with its aliases)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .max_score import MaxScorePicker
from .random_picker import RandomPicker
from .weighted_random import WeightedRandomPicker

if TYPE_CHECKING:
    from epp.framework.registry import Registry

BUILTINS: list[tuple[type, tuple[str, ...]]] = [
    (MaxScorePicker, ()),
    (RandomPicker, ()),
    (WeightedRandomPicker, ()),
]


def register(registry: Registry) -> None:
    """Register this group's plugin classes."""
    for cls, aliases in BUILTINS:
        registry.register(cls, aliases=aliases)
