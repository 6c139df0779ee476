"""OpenTelemetry tracing of the request path (the optional ``tracing`` extra: ``opentelemetry-sdk`` and the OTLP
gRPC exporter).

:func:`build_tracing` returns a :class:`Tracing` or None; None is "off", and the request path then makes no span,
context or attribute dict (every hook is behind one ``is not None`` test). Configuration is the standard OTEL_*
environment, as the reference: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (and the exporter's other variables),
``OTEL_SERVICE_NAME``, and the sampler ``parentbased_traceidratio`` whose ratio is ``--tracing-sampling-ratio``,
else ``OTEL_TRACES_SAMPLER_ARG``, else :data:`DEFAULT_SAMPLING_RATIO`. Spans (names in docs/observability.md): a
SERVER root per request (:data:`ROOT_SPAN`), children for admission, scheduling (one per profile run, with the
filters' survivors, each scorer's top :data:`TOP_N` per-endpoint scores and the pick) and the upstream call.
W3C ``traceparent``/``tracestate`` come from the client's headers (a malformed one is ignored: a new trace starts)
and go upstream from the upstream span.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span, Tracer

    from epp.framework.endpoint import Endpoint
    from epp.framework.plugins import ProfileRunResult

__all__ = ["Tracing", "ProfileTrace", "SchedulingTrace", "build_tracing", "otlp_configured", "sampling_ratio", "top_scores", "ROOT_SPAN", "TOP_N",
           "DEFAULT_SAMPLING_RATIO", "DEFAULT_SERVICE_NAME"]

log = logging.getLogger("epp.observability")

ROOT_SPAN = "gateway.request"
"""The reference's name for the span of one request through EPP."""
TOP_N = 5
"""Endpoints whose scores a profile span carries, per scorer and in total (the best ones): bounded attributes."""
DEFAULT_SAMPLING_RATIO = 0.1
"""The reference's sampling ratio (its chart's ``samplerArg``) when neither the flag nor the environment sets one."""
DEFAULT_SERVICE_NAME = "epp"
"""``service.name`` when ``OTEL_SERVICE_NAME`` is not set."""
SAMPLER = "parentbased_traceidratio"
"""The one sampler EPP builds, as the reference: it follows the client's sampled flag, else samples by ratio."""


def otlp_configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment names an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``): tracing's default when not asked for either way. The reference's
    default is on, exporting to ``localhost:4317`` when nothing says otherwise; EPP waits to be told where, so a
    replica without a collector neither exports to nothing nor logs the exporter's retries."""
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def sampling_ratio(flag: float | None, environ: Mapping[str, str] = os.environ) -> float:
    """The sampling ratio: ``flag`` when given, else ``OTEL_TRACES_SAMPLER_ARG`` (``ValueError`` when it is no
    number in [0, 1]), else :data:`DEFAULT_SAMPLING_RATIO`."""
    if flag is not None:
        return flag
    text = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if not text:
        return DEFAULT_SAMPLING_RATIO
    try:
        ratio = float(text)
    except ValueError:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={text!r} is not a number in [0, 1]") from None
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={text!r} is not a number in [0, 1]")
    return ratio


def build_tracing(ratio: float | None = None, processor: SpanProcessor | None = None,
                  environ: Mapping[str, str] = os.environ) -> Tracing | None:
    """A :class:`Tracing` exporting through ``processor`` (default: a ``BatchSpanProcessor`` over the OTLP gRPC
    exporter, configured by the OTEL_* environment), or None with a WARNING when the ``tracing`` extra is not
    installed: tracing then costs nothing."""
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError:
        log.warning("tracing: the OpenTelemetry SDK is not installed (pip install 'epp[tracing]'); no spans")
        return None
    sampler_name = environ.get("OTEL_TRACES_SAMPLER", SAMPLER).strip() or SAMPLER
    if sampler_name != SAMPLER:
        log.warning("tracing: OTEL_TRACES_SAMPLER=%s is not supported; using %s", sampler_name, SAMPLER)
    ratio = sampling_ratio(ratio, environ)
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: DEFAULT_SERVICE_NAME}
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)), resource=Resource.create(attributes))
    if processor is None:
        processor = _otlp_processor()
        if processor is None:
            return None
    provider.add_span_processor(processor)
    log.info("tracing: %s with ratio %g", SAMPLER, ratio)
    return Tracing(provider)


def _otlp_processor() -> SpanProcessor | None:
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("tracing: the OTLP exporter is not installed (pip install 'epp[tracing]'); no spans")
        return None
    return BatchSpanProcessor(OTLPSpanExporter())


class Tracing:
    """The tracer and the W3C propagator, shared by every request; built by :func:`build_tracing`."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("epp")
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self._server = trace.SpanKind.SERVER
        self._client = trace.SpanKind.CLIENT
        self._error = trace.Status(trace.StatusCode.ERROR)

    def start_request(self, front_end: str, headers: Mapping[str, str], path: str) -> Span:
        """The root span of a request, a child of the client's ``traceparent`` when it has a valid one."""
        parent = self._propagator.extract(headers) if "traceparent" in headers else None
        return self.tracer.start_span(ROOT_SPAN, parent, self._server,
                                      {"epp.front_end": front_end, "url.path": path})

    def child(self, parent: Span, name: str, client: bool = False) -> Span:
        """A span under ``parent`` (a CLIENT one for a call out of EPP)."""
        ctx = self._trace.set_span_in_context(parent)
        return self.tracer.start_span(name, ctx, self._client if client else self._trace.SpanKind.INTERNAL)

    def inject(self, span: Span, headers: dict[str, str]) -> None:
        """Set ``traceparent`` (and ``tracestate`` when there is one) in ``headers`` from ``span``."""
        self._propagator.inject(headers, self._trace.set_span_in_context(span))

    def fail(self, span: Span, message: str) -> None:
        """Mark ``span`` as failed with ``message``."""
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, message))

    def scheduling(self, parent: Span) -> SchedulingTrace:
        """The recorder of one scheduling cycle under ``parent``."""
        return SchedulingTrace(self, self.child(parent, "epp.scheduling"))

    def shutdown(self) -> None:
        """Export what is pending and stop (blocking: run it off the event loop)."""
        self.provider.shutdown()


class SchedulingTrace:
    """The span of one request's scheduling (data producers, admitters, the cycle); :meth:`profile` makes a
    :class:`ProfileTrace` per profile run. Ends once, at the first :meth:`end`."""

    __slots__ = ("tracing", "span", "ended")

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self.tracing = tracing
        self.span = span
        self.ended = False

    def profile(self, name: str, candidates: int) -> ProfileTrace:
        span = self.tracing.child(self.span, "epp.scheduling.profile")
        span.set_attribute("epp.profile.name", name)
        span.set_attribute("epp.profile.candidates", candidates)
        return ProfileTrace(span)

    def end(self, error: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        if error is not None:
            self.tracing.fail(self.span, error)
        self.span.end()


class ProfileTrace:
    """What one profile run did, as its span's attributes: each filter's survivors, each scorer's weight and top
    :data:`TOP_N` scores (``ip:port=score``), the weighted totals' top and the picked endpoints."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def filtered(self, plugin: Any, endpoints: Sequence[Endpoint]) -> None:
        self.span.set_attribute(f"epp.filter.{plugin.name}.endpoints", len(endpoints))

    def scored(self, plugin: Any, weight: float, endpoints: Sequence[Endpoint], scores: Sequence[float]) -> None:
        self.span.set_attribute(f"epp.scorer.{plugin.name}.weight", weight)
        self.span.set_attribute(f"epp.scorer.{plugin.name}.scores", top_scores(endpoints, scores))

    def end(self, result: ProfileRunResult | None) -> None:
        span = self.span
        if result is None:
            span.set_attribute("epp.profile.picked", [])
        else:
            span.set_attribute("epp.profile.picked", [ep.hostport for ep in result.endpoints])
            if result.scored:
                span.set_attribute("epp.profile.scores", top_scores([s.endpoint for s in result.scored],
                                                                    [s.score for s in result.scored]))
        span.end()


def top_scores(endpoints: Sequence[Endpoint], scores: Sequence[float], n: int = TOP_N) -> list[str]:
    """The ``n`` best ``ip:port=score`` (score to 4 places), best first."""
    best = sorted(zip(scores, range(len(scores))), reverse=True)[:n]
    return [f"{endpoints[i].hostport}={score:.4g}" for score, i in best]

