"""Built-in request-control plugins (lifecycle hooks around a request); `register` adds each class in BUILTINS."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .destination_endpoint_served_verifier import DestinationEndpointServedVerifier
from .latency_slo_admitter import LatencySloAdmitter
from .probabilistic_admitter import ProbabilisticAdmitter
from .request_attribute_reporter import RequestAttributeReporter

if TYPE_CHECKING:
    from epp.framework.registry import Registry

BUILTINS: list[tuple[type, tuple[str, ...]]] = [
    (RequestAttributeReporter, ()),
    (DestinationEndpointServedVerifier, ()),
    (ProbabilisticAdmitter, ()),
    (LatencySloAdmitter, ()),
]


def register(registry: Registry) -> None:
    """Register this group's plugin classes."""
    for cls, aliases in BUILTINS:
        registry.register(cls, aliases=aliases)
