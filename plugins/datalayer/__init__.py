"""Built-in datalayer plugins; `register` adds each class listed in BUILTINS (with its aliases).

``endpoint-notification-source`` (KV-event notifications for precise prefix scoring) is not registered here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core_metrics_extractor import CoreMetricsExtractor
from .metrics_source import MetricsDataSource

if TYPE_CHECKING:
    from epp.registry import Registry

BUILTINS: list[tuple[type, tuple[str, ...]]] = [
    (MetricsDataSource, ()),
    (CoreMetricsExtractor, ()),
]


def register(registry: Registry) -> None:
    """Register this group's plugin classes."""
    for cls, aliases in BUILTINS:
        registry.register(cls, aliases=aliases)
