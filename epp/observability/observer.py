"""What both front ends and the Director tell about one request, for tracing and the access log.

An :class:`Observer` exists only when tracing or the access log is on; front ends ask the Director's ``observer``
for an :class:`Observation` per request (``observer.start(front_end, headers, path)``) and hand it to the Director
(``parse``, ``route``, ``record_rejection``), which keeps it in the request's context. With both off the observer
is None and nothing of this module runs. An observation ends exactly once: at completion (the access line, the
spans' status), at a refusal (the refusal line) or, for neither, when the front end closes it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from epp.errors import EppError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import ResponseInfo, SchedulingResult
from epp.framework.request import REQUEST_ID_HEADER, InferenceRequest, header_text
from epp.observability.access_log import AccessLog
from epp.observability.tracing import SchedulingTrace, Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["Observer", "Observation", "ACCESS_SCORES"]

ACCESS_SCORES = 3
"""Endpoints whose weighted scores an access line shows (the best ones of the primary profile)."""


class Observer:
    """Tracing and the access log, each None when off (at least one is on)."""

    def __init__(self, tracing: Tracing | None = None, access_log: AccessLog | None = None) -> None:
        self.tracing = tracing
        self.access_log = access_log

    def start(self, front_end: str, headers: dict[str, str], path: str) -> Observation:
        """A request arrived at ``front_end`` (``gateway`` or ``extproc``) with ``headers`` (already stripped)."""
        return Observation(self, front_end, headers, path)


class Observation:
    """One request's spans and access-log facts (see the module docstring for its life)."""

    __slots__ = ("tracing", "access_log", "front_end", "headers", "start", "span", "stage", "upstream", "request",
                 "result", "target", "done")

    def __init__(self, observer: Observer, front_end: str, headers: dict[str, str], path: str) -> None:
        self.tracing = tracing = observer.tracing
        self.access_log = observer.access_log
        self.front_end = front_end
        self.headers = headers
        self.start = time.monotonic()
        self.span: Span | None = tracing.start_request(front_end, headers, path) if tracing is not None else None
        self.stage: Span | None = None  # the admission span while it runs
        self.upstream: Span | None = None  # the current upstream attempt's span
        self.request: InferenceRequest | None = None
        self.result: SchedulingResult | None = None
        self.target: Endpoint | None = None
        self.done = False

    # -- the Director's side ----------------------------------------------------------------------------------

    def admitting(self, request: InferenceRequest) -> None:
        """The request was parsed and waits for admission."""
        self.request = request
        if self.span is not None and self.tracing is not None:
            self._attributes(request)
            self.stage = self.tracing.child(self.span, "epp.admission")

    def scheduling(self) -> SchedulingTrace | None:
        """Admission is done; the recorder of the scheduling cycle (None without tracing)."""
        self._end_stage()
        if self.span is None or self.tracing is None:
            return None
        return self.tracing.scheduling(self.span)

    def routed(self, result: SchedulingResult) -> None:
        """The request is in flight on ``result``'s target."""
        self.result = result
        self.target = result.target
        span = self.span
        if span is not None:
            span.set_attribute("epp.profile.primary", result.primary_profile)
            span.set_attribute("epp.endpoint", result.target.hostport)
            if result.prefill is not None:
                span.set_attribute("epp.prefill_endpoint", result.prefill.hostport)

    def first_byte(self) -> None:
        self.event("first_byte")

    def event(self, name: str) -> None:
        """A step of the exchange (``response_headers``, ``first_byte``) as an event on the root span."""
        if self.span is not None:
            self.span.add_event(name)

    def complete(self, info: ResponseInfo, target: Endpoint, ttft: float | None) -> None:
        """The request ended with ``info`` on ``target``: the access line; the spans end."""
        if self.done:
            return
        self.done = True
        self.target = target
        if self.access_log is not None:
            self.access_log.request(self._access_fields(info, ttft))
        span = self.span
        if span is not None and self.tracing is not None:
            status = info.status
            span.set_attribute("http.response.status_code", status)
            if self.upstream is not None:
                self.upstream.set_attribute("http.response.status_code", status)
                if info.error:
                    self.tracing.fail(self.upstream, f"status {status}")
                self.upstream.end()
                self.upstream = None
            if status >= 500 or status == 0:
                self.tracing.fail(span, f"status {status}")
            span.end()

    def refused(self, exc: EppError, request: InferenceRequest | None = None) -> None:
        """EPP refused the request with ``exc`` (before it was routed, or a front end's own refusal)."""
        if self.done:
            return
        self.done = True
        if request is not None:
            self.request = request
        if self.access_log is not None:
            self.access_log.refusal(self._refusal_fields(exc), exc.status)
        span = self.span
        if span is not None and self.tracing is not None:
            if self.stage is not None:
                self.tracing.fail(self.stage, exc.message)
            self._end_stage()
            if request is not None:
                self._attributes(request)
            span.set_attribute("http.response.status_code", exc.status)
            span.set_attribute("error.type", exc.code.value)
            self.tracing.fail(span, exc.message)
            span.end()

    # -- the front ends' side ---------------------------------------------------------------------------------

    def upstream_start(self, endpoint: Endpoint, headers: dict[str, str], role: str = "decode") -> None:
        """An upstream attempt on ``endpoint`` starts (a retry ends the attempt before it as failed); with
        tracing, its ``traceparent`` goes into ``headers`` (the request headers the model server gets)."""
        tracing, span = self.tracing, self.span
        if tracing is None or span is None or self.done:
            return
        if self.upstream is not None:
            tracing.fail(self.upstream, "retried on another endpoint")
            self.upstream.end()
        up = self.upstream = tracing.child(span, "epp.upstream", client=True)
        up.set_attribute("server.address", endpoint.hostport)
        up.set_attribute("epp.role", role)
        tracing.inject(up, headers)

    def upstream_end(self, status: int) -> None:
        """The current upstream attempt ended with ``status`` before the request did (a prefill step)."""
        up = self.upstream
        if up is not None and self.tracing is not None:
            up.set_attribute("http.response.status_code", status)
            if status >= 400 or status == 0:
                self.tracing.fail(up, f"status {status}")
            up.end()
            self.upstream = None

    def close(self) -> None:
        """The front end is done with the request: end what is still open (a request neither completed nor
        refused, such as one without a body routed at random)."""
        if self.done:
            return
        self.done = True
        if self.span is not None:
            self._end_stage()
            if self.upstream is not None:
                self.upstream.end()
            self.span.end()

    # -- helpers ----------------------------------------------------------------------------------------------

    def _end_stage(self) -> None:
        if self.stage is not None:
            self.stage.end()
            self.stage = None

    def _attributes(self, request: InferenceRequest) -> None:
        span = self.span
        if span is not None:
            span.set_attribute("gen_ai.request.model", request.model)
            span.set_attribute("epp.target_model", request.target_model)
            span.set_attribute("epp.request_id", request.request_id)
            span.set_attribute("epp.fairness_id", request.fairness_id)
            span.set_attribute("epp.priority", request.priority)

    def _base_fields(self) -> dict[str, Any]:
        req = self.request
        fields: dict[str, Any] = {"front_end": self.front_end}
        if req is not None:
            fields.update(request_id=req.request_id, tenant=req.fairness_id, model=req.model,
                          target_model=req.target_model, priority=req.priority)
        else:
            fields["request_id"] = _client_request_id(self.headers)
        if self.span is not None:
            fields["trace_id"] = format(self.span.get_span_context().trace_id, "032x")
        return fields

    def _access_fields(self, info: ResponseInfo, ttft: float | None) -> dict[str, Any]:
        fields = self._base_fields()
        if self.target is not None:
            fields["endpoint"] = self.target.hostport
        result = self.result
        if result is not None:
            if result.prefill is not None:
                fields["prefill_endpoint"] = result.prefill.hostport
            fields["profile"] = result.primary_profile
            scores = result.endpoint_scores()
            if scores:
                fields["scores"] = dict(sorted(scores.items(), key=lambda kv: -kv[1])[:ACCESS_SCORES])
        fields.update(status=info.status, ttft_ms=None if ttft is None else round(ttft * 1e3, 3),
                      duration_ms=round((time.monotonic() - self.start) * 1e3, 3),
                      prompt_tokens=info.prompt_tokens, completion_tokens=info.completion_tokens,
                      cached_tokens=info.cached_tokens, streamed=info.streamed)
        return fields

    def _refusal_fields(self, exc: EppError) -> dict[str, Any]:
        fields = self._base_fields()
        fields.update(status=exc.status, error_code=exc.code.value, error=exc.message[:200],
                      duration_ms=round((time.monotonic() - self.start) * 1e3, 3))
        return fields


def _client_request_id(headers: dict[str, str]) -> str | None:
    """The client's ``x-request-id`` when the body was never parsed (None when absent or not text)."""
    try:
        return header_text(headers, REQUEST_ID_HEADER)
    except EppError:
        return None

