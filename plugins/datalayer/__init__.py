"""Built-in datalayer plugins; `register` adds each class listed in BUILTINS (with its aliases).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core_metrics_extractor import CoreMetricsExtractor
from .endpoint_notification_source import EndpointNotificationSource
from .file_discovery import FileDiscovery
from .metrics_source import MetricsDataSource
from .models_extractor import ModelsExtractor
from .models_source import ModelsDataSource

if TYPE_CHECKING:
    from epp.framework.registry import Registry

BUILTINS: list[tuple[type, tuple[str, ...]]] = [
    (MetricsDataSource, ()),
    (CoreMetricsExtractor, ()),
    (EndpointNotificationSource, ()),
    (ModelsDataSource, ()),
    (ModelsExtractor, ()),
    (FileDiscovery, ()),
]


def register(registry: Registry) -> None:
    """Register this group's plugin classes."""
    for cls, aliases in BUILTINS:
        registry.register(cls, aliases=aliases)
