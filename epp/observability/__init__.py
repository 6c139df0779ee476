"""Observability of the request path: OpenTelemetry tracing (:mod:`.tracing`, the optional ``tracing`` extra)
and the JSON access log (:mod:`.access_log`), both reached through one per-request :class:`Observation`
(:mod:`.observer`). Off (the default for the access log), none of it runs: the Director's ``observer`` is None."""

from epp.observability.access_log import AccessLog
from epp.observability.observer import Observation, Observer
from epp.observability.tracing import (
    ProfileTrace,
    SchedulingTrace,
    Tracing,
    build_tracing,
    otlp_configured,
    sampling_ratio,
)

__all__ = ["AccessLog", "Observation", "Observer", "ProfileTrace", "SchedulingTrace", "Tracing", "build_tracing",
           "otlp_configured", "sampling_ratio"]
