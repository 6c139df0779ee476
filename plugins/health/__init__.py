"""Built-in passive-health plugins; `register` adds each class listed in BUILTINS (with its aliases)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .outlier_detector import OutlierDetector

if TYPE_CHECKING:
    from epp.framework.registry import Registry

BUILTINS: list[tuple[type, tuple[str, ...]]] = [
    (OutlierDetector, ()),
]


def register(registry: Registry) -> None:
    """Register this group's plugin classes."""
    for cls, aliases in BUILTINS:
        registry.register(cls, aliases=aliases)
