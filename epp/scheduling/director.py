"""The Director: one code path for a request's life, shared by the ext_proc service and the HTTP gateway.

``route()`` admits (flow control may make it wait), picks candidates (subset hint, health), asks the Admitter
plugins (:class:`~epp.framework.plugins.Admitter`; the first denial is a 500, as the reference), schedules, runs
PreRequest hooks and books the request in flight on the endpoints it chose, with the pipeline's
``inflight-load-producer`` (:class:`~epp.framework.plugins.InFlightAccounting`). The front end then forwards the
request and reports ``response_header()`` (the answer's head; hooks may add client headers), ``response_started()``
(first byte) and exactly one ``response_complete()`` (success, error or client gone). ``response_complete`` is
idempotent, so every exit path may call it: in-flight counts and the admission slot are released exactly once.
Passive health (:class:`~epp.framework.plugins.PassiveHealth`) hears every attempt's outcome from here: the final
status at completion, an attempt the gateway retries, endpoints Envoy skipped, a prefill step, an overdue first
byte; its ejected endpoints are left out of the candidates (never all of them).
Tracing and the access log (:mod:`epp.observability`) hear the request through the ``obs`` front ends pass in; with
both off the ``observer`` is None and no hook runs.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from epp.errors import EppError, ErrorCode, InternalError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import (
    Admitter,
    CycleState,
    Handle,
    InFlightAccounting,
    LoadBooking,
    Outcome,
    PassiveHealth,
    Plugin,
    PreRequest,
    RequestPreparer,
    ResponseChunk,
    ResponseComplete,
    ResponseHeaderProcessor,
    ResponseHeaders,
    ResponseInfo,
    ResponseStarted,
    SchedulingResult,
    outcome_of_status,
)
from epp.framework.request import InferenceRequest
from epp.headers import HeaderTrust

if TYPE_CHECKING:  # annotations only: the Director reaches these through the objects it is given
    from epp.datalayer.datastore import Datastore
    from epp.flowcontrol.base import Admission, AdmissionController
    from epp.observability import Observation, Observer, SchedulingTrace
    from epp.scheduling.scheduler import Scheduler

__all__ = ["Director", "RequestContext", "RequestMetrics", "RequestParser", "RequestPath", "RequestPipeline",
           "OpenAdmission"]


class _NoSlot:
    def release(self) -> None:
        return None


class OpenAdmission:
    """Admits everything at once (used when no admission controller is configured, e.g. in tests)."""

    async def admit(self, request: InferenceRequest, candidates: Callable[[], list[Endpoint]]) -> Admission:
        return _NoSlot()

    async def start(self) -> None:
        """Nothing runs in the background."""

    async def stop(self) -> None:
        """Nothing runs in the background."""

    def snapshot(self) -> dict[str, Any]:
        """Nothing is admitted under a quota: no tenants or queues to show."""
        return {"flowControl": False, "tenants": {}}


@runtime_checkable
class RequestParser(Protocol):
    """The pipeline's request parser plugin (or :class:`~epp.scheduling.parsers.ParserRegistry`): a body to an
    :class:`~epp.framework.request.InferenceRequest`, ``BadRequest`` on bad input. A parser may also offer
    ``usage_reader(request, sse)`` for answers in its own format (:meth:`Director.usage_reader`)."""

    def parse(self, path: str, body: bytes, headers: dict[str, str]) -> InferenceRequest: ...


class RequestPipeline(Protocol):
    """What the Director reads of a built pipeline (:class:`epp.config.loader.Pipeline` is one): the scheduler, the
    plugins (for its parser, preparers and in-flight accounting) and the hooks of each request-path stage."""

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def handle(self) -> Handle: ...

    @property
    def parser(self) -> Plugin: ...

    @property
    def admitters(self) -> list[Admitter]: ...

    @property
    def pre_request(self) -> list[PreRequest]: ...

    @property
    def response_header(self) -> list[ResponseHeaderProcessor]: ...

    @property
    def response_started(self) -> list[ResponseStarted]: ...

    @property
    def response_chunk(self) -> list[ResponseChunk]: ...

    @property
    def response_complete(self) -> list[ResponseComplete]: ...


class RequestMetrics(Protocol):
    """The subset of :class:`epp.metrics.families.EppMetrics` the request path records into."""

    def record_request(self, model: str, target: str, priority: int, fairness_id: str) -> None: ...
    def record_error(self, model: str, target: str, code: str, fairness_id: str, priority: int) -> None: ...
    def scheduled(self, target_model: str, endpoint: Endpoint, seconds: float) -> None: ...
    def scheduler_attempt(self, status: str, target_model: str, endpoint: Endpoint | None) -> None: ...
    def running_inc(self, model: str, target: str, fairness_id: str, priority: int) -> None: ...
    def completed(self, model: str, target: str, seconds: float, info: ResponseInfo, fairness_id: str,
                  priority: int, ttft: float | None) -> None: ...


@dataclass(slots=True)
class RequestContext:
    """One request in flight: its scheduling result, current target, in-flight booking and completion state."""

    request: InferenceRequest
    result: SchedulingResult
    admission: Admission
    target: Endpoint
    booking: LoadBooking
    start: float
    fallbacks: list[Endpoint] = field(default_factory=list)
    first_byte: float | None = None
    last_chunk: float = 0.0
    chunks: int = 0  # streamed chunks after the first that reached the client
    itl: Any = None  # the inter-chunk latency series to observe into, from the answer's second chunk (metrics on)
    done: bool = False
    overdue: asyncio.TimerHandle | None = None  # passive health's first-byte deadline, while it runs
    judged: bool = False  # passive health has heard the current target's outcome already (first byte overdue)
    obs: Observation | None = None  # tracing and the access log (epp.observability), when either is on

    @property
    def tokens(self) -> int:
        """Estimated tokens the request still holds on its target."""
        return self.booking.tokens

    @property
    def prefill(self) -> Endpoint | None:
        """The prefill endpoint, when disaggregation chose one."""
        return self.result.prefill

    @property
    def upstream_headers(self) -> dict[str, str]:
        """Headers PreRequest plugins asked to set on the upstream request."""
        return self.result.headers


class RequestPath(Protocol):
    """What a front end (the ext_proc stream, the gateway's proxy) asks of the Director, in call order; they use
    nothing else of it.

    ``parse`` then ``route`` start a request (each counts its own refusals; :meth:`record_rejection` counts one a
    front end makes itself); a request without a body goes to :meth:`any_endpoint` instead. Once routed, the
    front end may move the request (:meth:`served_by` the endpoint the proxy reports, :meth:`retry` on the next
    one to try, saying how the failed attempt ended), report a side attempt (:meth:`upstream_outcome`: the
    prefill step), say it will not see the answer's bytes (:meth:`first_byte_unseen`), then reports
    :meth:`response_header`, :meth:`response_started` (first byte), :meth:`stream_chunk` (each later streamed
    chunk) and exactly one :meth:`response_complete`.
    """

    @property
    def header_trust(self) -> HeaderTrust:
        """Which request headers the front ends keep (they strip the others before anything reads them)."""
        ...

    @property
    def observer(self) -> Observer | None:
        """Tracing and the access log: a front end starts an ``Observation`` per request with it and passes it to
        ``parse``, ``route`` and ``record_rejection``; None when both are off."""
        ...

    def parse(self, path: str, body: bytes, headers: dict[str, str],
              obs: Observation | None = None) -> InferenceRequest: ...

    async def route(self, request: InferenceRequest, subset: Sequence[str] | None = None,
                    obs: Observation | None = None) -> RequestContext: ...

    def any_endpoint(self) -> Endpoint | None: ...

    def record_rejection(self, exc: EppError, request: InferenceRequest | None = None,
                         obs: Observation | None = None) -> None: ...

    def served_by(self, ctx: RequestContext, hostport: str) -> bool: ...

    def retry(self, ctx: RequestContext, tried: Sequence[Endpoint],
              failed: Outcome | None = None) -> Endpoint | None: ...

    def upstream_outcome(self, ctx: RequestContext, endpoint: Endpoint, outcome: Outcome | None) -> None: ...

    def first_byte_unseen(self, ctx: RequestContext) -> None: ...

    def usage_reader(self, request: InferenceRequest, sse: bool) -> Any: ...

    def response_header(self, ctx: RequestContext, status: int, served: str,
                        metadata: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None) -> Mapping[str, str]: ...

    def response_started(self, ctx: RequestContext) -> None: ...

    def stream_chunk(self, ctx: RequestContext) -> None: ...

    def response_complete(self, ctx: RequestContext, info: ResponseInfo) -> None: ...


class Director:
    """Runs the request path over a built pipeline (:class:`RequestPipeline`) and a
    :class:`~epp.datalayer.datastore.Datastore`; front ends use its :class:`RequestPath` side only."""

    def __init__(self, pipeline: RequestPipeline, datastore: Datastore, admission: AdmissionController | None = None,
                 metrics: RequestMetrics | None = None, *, use_subset_hint: bool = True,
                 priorities: Callable[[str | None], int] | None = None,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 header_trust: HeaderTrust | None = None, observer: Observer | None = None) -> None:
        self.pipeline = pipeline
        self.observer = observer
        self.header_trust = header_trust or HeaderTrust()  # both front ends strip request headers by it
        self.scheduler = pipeline.scheduler
        self.datastore = datastore
        self.admission: AdmissionController = admission or OpenAdmission()
        self.metrics = metrics
        self.use_subset_hint = use_subset_hint
        self.priorities = priorities
        self.clock = clock
        self.rng = rng or random.Random()
        parser = pipeline.parser
        if not isinstance(parser, RequestParser):
            raise ValueError(f"the pipeline's parser {parser.name!r} has no parse method")
        self.parser: RequestParser = parser
        self._usage_reader: Callable[[InferenceRequest, bool], Any] | None = getattr(parser, "usage_reader", None)
        self.preparers = [p for p in pipeline.handle.plugins() if isinstance(p, RequestPreparer)]
        self.admitters: list[Admitter] = pipeline.admitters  # the pipeline's list: a test may append to it
        load = next((p for p in pipeline.handle.plugins() if isinstance(p, InFlightAccounting)), None)
        if load is None:  # build_pipeline always adds one
            raise ValueError("the pipeline has no inflight-load-producer to book in-flight load with")
        self.load: InFlightAccounting = load
        self.health = next((p for p in pipeline.handle.plugins() if isinstance(p, PassiveHealth)), None)
        attach_health = getattr(metrics, "attach_health", None)
        if self.health is not None and attach_health is not None:
            attach_health(self.health, datastore.pool_name)

    def use_scheduler(self, scheduler: Scheduler) -> None:
        """Schedule the requests that start from now on with ``scheduler`` (a config reload); a request already in
        its scheduling cycle finishes with the one it began with."""
        self.scheduler = scheduler

    def parse(self, path: str, body: bytes, headers: dict[str, str],
              obs: Observation | None = None) -> InferenceRequest:
        """Parse a request body with the configured parser plugin (``BadRequest`` on bad input, counted as a
        rejection), then resolve its priority and target model (:meth:`_apply_objective`,
        :meth:`_apply_rewrite`)."""
        try:
            request = self.parser.parse(path, body, headers)
        except EppError as exc:
            self.record_rejection(exc, None, obs)
            raise
        self._apply_objective(request)
        if self.datastore.rewrites:
            self._apply_rewrite(request)
        return request

    def _apply_objective(self, request: InferenceRequest) -> None:
        """The priority of the request's InferenceObjective (from the cluster or the endpoints file), else of the
        flow-control config's ``objectives``, else 0."""
        if request.objective is None:
            return
        priority = self.datastore.objectives.priority(request.objective)
        if priority is None and self.priorities is not None:
            priority = self.priorities(request.objective)
        if priority is not None:
            request.priority = priority

    def _apply_rewrite(self, request: InferenceRequest) -> None:
        """An InferenceModelRewrite rule matching the model the client named picks the target model (over the
        ``x-llm-d-router-model-name-rewrite`` header, as the reference); the decision is counted."""
        decision = self.datastore.rewrites.rule_for(request.model)
        if decision is None:
            return
        target = decision.rule.choose(self.rng)
        if target is None:
            return
        request.target_model = target
        if self.metrics is not None:
            record = getattr(self.metrics, "record_model_rewrite", None)
            if record is not None:
                record(decision.rewrite_name, request.model, target)

    def candidates(self, subset: Sequence[str] | None = None) -> list[Endpoint]:
        """Endpoints a request may go to: the subset hint (matched by IP) if any, healthy ones preferred, without
        the ones passive health ejected (unless that leaves none)."""
        endpoints = self.datastore.endpoints()
        if subset is not None and self.use_subset_hint:
            ips = {_ip_of(s) for s in subset}
            endpoints = [ep for ep in endpoints if ep.address in ips]
        healthy = [ep for ep in endpoints if ep.healthy] or endpoints
        return self.health.admissible(healthy) if self.health is not None else healthy

    def any_endpoint(self) -> Endpoint | None:
        """An endpoint for a request without a body: a random pool endpoint (healthy ones preferred), as the
        reference's ``GetRandomEndpoint`` (no scheduling, nothing to parse, no subset hint); None for an empty pool."""
        candidates = self.candidates(None)
        return random.choice(candidates) if candidates else None

    async def route(self, request: InferenceRequest, subset: Sequence[str] | None = None,
                    obs: Observation | None = None) -> RequestContext:
        """Admit and schedule ``request``; the returned context is in flight until ``response_complete``."""
        if self.metrics is not None:
            self.metrics.record_request(request.model, request.target_model, request.priority, request.fairness_id)
        if obs is not None:
            obs.admitting(request)
        try:
            admission = await self.admission.admit(request, lambda: self.candidates(subset))
        except EppError as exc:
            self.record_rejection(exc, request, obs)
            raise
        # With tracing, one span from here: data producers, admitters and the cycle (a span per profile run).
        trace = obs.scheduling() if obs is not None else None
        try:
            for preparer in self.preparers:
                await preparer.prepare(request)
            candidates = self.candidates(subset)
            # The reference's order: PrepareData, then the admitters (which may read what it produced), then the cycle.
            cycle = self.scheduler.prepare(request, candidates) if candidates else CycleState()
            if self.admitters:  # one truth test when none is configured
                self._admit(request, candidates, cycle)
            result = self._schedule(request, candidates, cycle, trace)
            for hook in self.pipeline.pre_request:
                hook.pre_request(request, result)
        except BaseException as exc:
            if trace is not None:
                trace.end(f"{type(exc).__name__}: {exc}")
            admission.release()
            if isinstance(exc, EppError):
                self.record_rejection(exc, request, obs)
            raise
        return self._start(request, result, admission, obs)

    def _admit(self, request: InferenceRequest, candidates: list[Endpoint], cycle: CycleState) -> None:
        """Ask each Admitter in config order; the first denial raises the reference's error for it (Internal,
        ``request cannot be admitted: <reason>``) and the rest are not asked."""
        for admitter in self.admitters:
            reason = admitter.admit_request(request, candidates, cycle)
            if reason is not None:
                raise InternalError(f"request cannot be admitted: {reason}")

    def _schedule(self, request: InferenceRequest, candidates: list[Endpoint], cycle: CycleState,
                  trace: SchedulingTrace | None = None) -> SchedulingResult:
        start = time.perf_counter()
        try:
            result = self.scheduler.schedule(request, candidates, cycle, trace)
        except EppError:
            if self.metrics is not None:
                self.metrics.scheduler_attempt("failure", request.target_model, None)
            raise
        if trace is not None:
            trace.end()
        if self.metrics is not None:
            self.metrics.scheduled(request.target_model, result.target, time.perf_counter() - start)
        return result

    def _start(self, request: InferenceRequest, result: SchedulingResult, admission: Admission,
               obs: Observation | None = None) -> RequestContext:
        booking = self.load.book(request, result)
        ctx = RequestContext(request, result, admission, result.target, booking, self.clock(),
                             fallbacks=list(result.endpoints[1:]), obs=obs)
        if obs is not None:
            obs.routed(result)
        if request.stream and self.health is not None and self.health.first_byte_timeout is not None:
            # Streamed answers only: a non-streamed answer's first byte is its last, so its wait says nothing.
            self._arm_first_byte(ctx, self.health.first_byte_timeout)
        if self.metrics is not None:
            self.metrics.running_inc(request.model, request.target_model, request.fairness_id, request.priority)
            record_sizes = getattr(self.metrics, "record_sizes", None)
            if record_sizes is not None:  # recorded once routed, as the reference does
                record_sizes(request.model, request.target_model, request.body_size, None, request.fairness_id,
                             request.priority)
        return ctx

    def _arm_first_byte(self, ctx: RequestContext, seconds: float) -> None:
        """Passive health hears of a first byte that has not come ``seconds`` from now (the request goes on)."""
        if ctx.overdue is not None:
            ctx.overdue.cancel()
        ctx.overdue = asyncio.get_running_loop().call_later(seconds, self._first_byte_overdue, ctx)

    def _first_byte_overdue(self, ctx: RequestContext) -> None:
        ctx.overdue = None
        if ctx.done or ctx.first_byte is not None or self.health is None:
            return
        ctx.judged = True
        self.health.observe(ctx.target, Outcome.FIRST_BYTE_TIMEOUT, ctx.request.target_model)

    def _judge(self, ctx: RequestContext, endpoint: Endpoint, outcome: Outcome | None) -> None:
        if outcome is not None and self.health is not None:
            self.health.observe(endpoint, outcome, ctx.request.target_model, ctx.start)

    def upstream_outcome(self, ctx: RequestContext, endpoint: Endpoint, outcome: Outcome | None) -> None:
        """An attempt on ``endpoint`` that is not the request's own (the gateway's prefill step) ended with
        ``outcome`` (None: nothing to say)."""
        self._judge(ctx, endpoint, outcome)

    def first_byte_unseen(self, ctx: RequestContext) -> None:
        """The front end will not see the answer's bytes (ext_proc with response body mode NONE): no first-byte
        deadline for this request."""
        if ctx.overdue is not None:
            ctx.overdue.cancel()
            ctx.overdue = None

    def retarget(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        """Move the request to a fallback ``endpoint`` (before any byte reached the client)."""
        ctx.booking.move(endpoint)
        ctx.target = endpoint
        if endpoint in ctx.fallbacks:
            ctx.fallbacks.remove(endpoint)
        ctx.judged = False
        if ctx.overdue is not None and self.health is not None and self.health.first_byte_timeout is not None:
            self._arm_first_byte(ctx, self.health.first_byte_timeout)  # the new endpoint gets its own deadline

    def next_fallback(self, ctx: RequestContext) -> Endpoint | None:
        """The next fallback endpoint that is still in the pool, or None."""
        while ctx.fallbacks:
            ep = ctx.fallbacks.pop(0)
            if self.datastore.get(ep.name) is ep:
                return ep
        return None

    def served_by(self, ctx: RequestContext, hostport: str) -> bool:
        """The proxy reports it sent the request to ``hostport``: move the request there when that is another pool
        endpoint; False when no pool endpoint has that address (the request stays where it was)."""
        if not hostport or hostport == ctx.target.hostport:
            return True
        endpoint = self.datastore.by_hostport(hostport)
        if endpoint is None:
            return False
        if self.health is not None:  # Envoy walks EPP's list in order: the endpoints before this one failed
            for skipped in [ctx.target, *ctx.fallbacks]:
                if skipped is endpoint:
                    break
                if not ctx.judged or skipped is not ctx.target:
                    self._judge(ctx, skipped, Outcome.PROXY_RETRIED)
        self.retarget(ctx, endpoint)
        return True

    def retry(self, ctx: RequestContext, tried: Sequence[Endpoint],
              failed: Outcome | None = None) -> Endpoint | None:
        """Move the request to the next endpoint to try after a failed attempt (before any byte reached the
        client): the picker's next fallback not in ``tried``, else a fresh pick among the pool's endpoints not in
        ``tried``. Returns it, or None (the request stays where it was) when none is left. ``failed``: how the
        attempt ended, told to passive health once the request moves (when it stays, its completion tells)."""
        ep = self.next_fallback(ctx)
        while ep is not None and ep in tried:
            ep = self.next_fallback(ctx)
        if ep is None:
            candidates = [c for c in self.candidates() if c not in tried]
            if not candidates:
                return None
            try:
                ep = self.scheduler.schedule(ctx.request, candidates).target
            except EppError:
                return None
        if not ctx.judged:
            self._judge(ctx, ctx.target, failed)
        self.retarget(ctx, ep)
        return ep

    def usage_reader(self, request: InferenceRequest, sse: bool) -> Any:
        """The parser's own reader of the answer's token usage (a parser of a format with usage elsewhere), or
        None: the front end's reader for the request's API applies."""
        reader = self._usage_reader
        return reader(request, sse) if reader is not None else None

    def response_header(self, ctx: RequestContext, status: int, served: str,
                        metadata: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None) -> Mapping[str, str]:
        """The answer's head arrived (``status``; ``served``: the ``host:port`` the proxy says it used, "" if it did
        not say): run the ResponseHeaderProcessor hooks. Returns the headers plugins add to the client's answer
        (those PreRequest hooks set, then the ones these hooks add); ``metadata`` (the proxy's filter metadata) is
        read only when a hook runs."""
        hooks = self.pipeline.response_header
        if not hooks:  # the common case: no ResponseHeaders built
            return ctx.result.response_headers
        response = ResponseHeaders(status, served, metadata() if metadata is not None else {})
        for hook in hooks:
            hook.response_header(ctx.request, response, ctx.target)
        if not response.headers:
            return ctx.result.response_headers
        return {**ctx.result.response_headers, **response.headers}

    def response_started(self, ctx: RequestContext) -> None:
        """The first response byte arrived (the time TTFT is measured to, recorded at completion): release what
        the booking holds until then (the prefill endpoint's share), run hooks (once)."""
        if ctx.first_byte is not None or ctx.done:
            return
        ctx.first_byte = ctx.last_chunk = self.clock()
        if ctx.overdue is not None:
            ctx.overdue.cancel()
            ctx.overdue = None
        ctx.booking.started()
        if ctx.obs is not None:
            ctx.obs.first_byte()
        for hook in self.pipeline.response_started:
            hook.response_started(ctx.request, ctx.target)

    def stream_chunk(self, ctx: RequestContext) -> None:
        """A streamed chunk after the first reached the client: observes the gap since the previous one (the
        inter-chunk latency EPP sees), when the metrics offer it; counts the chunk. The series is found at the first
        gap, so an answer in one chunk leaves no empty one. Runs the chunk hooks (an answer's progress)."""
        ctx.chunks += 1
        for hook in self.pipeline.response_chunk:
            hook.response_chunk(ctx.request, ctx.target)
        itl = ctx.itl
        if itl is None:
            itl_series = getattr(self.metrics, "itl_series", None) if ctx.chunks == 1 else None
            if itl_series is None:
                return
            req = ctx.request
            itl = ctx.itl = itl_series(req.model, req.target_model, req.fairness_id, req.priority)
        now = self.clock()
        itl.observe(now - ctx.last_chunk)
        ctx.last_chunk = now

    def response_complete(self, ctx: RequestContext, info: ResponseInfo) -> None:
        """The request ended (any way). Releases in-flight counts and admission exactly once; runs hooks."""
        if ctx.done:
            return
        ctx.done = True
        ctx.booking.finish()
        ctx.admission.release()
        if info.streamed and ctx.first_byte is not None:
            info.stream_chunks = ctx.chunks + 1
        if self.health is not None:
            if ctx.overdue is not None:
                ctx.overdue.cancel()
                ctx.overdue = None
            if not ctx.judged:
                self._judge(ctx, ctx.target, outcome_of_status(info.status, cut=info.error))
        self._record_completion(ctx, info)
        if ctx.obs is not None:
            ctx.obs.complete(info, ctx.target, None if ctx.first_byte is None else ctx.first_byte - ctx.start)
        for hook in self.pipeline.response_complete:
            hook.response_complete(ctx.request, ctx.target, info)

    def _record_completion(self, ctx: RequestContext, info: ResponseInfo) -> None:
        m = self.metrics
        if m is None:
            return
        req = ctx.request
        ttft = None if ctx.first_byte is None else ctx.first_byte - ctx.start
        m.completed(req.model, req.target_model, self.clock() - ctx.start, info, req.fairness_id, req.priority, ttft)
        if info.response_bytes is not None:
            record_sizes = getattr(m, "record_sizes", None)
            if record_sizes is not None:
                record_sizes(req.model, req.target_model, None, info.response_bytes, req.fairness_id, req.priority)
        if info.error and info.status >= 500:
            # A model server's 5xx, counted on purpose: the reference has this code but tests a response header
            # "status" that Envoy never sends (it sends ":status"), so it never counts one. Its 4xx answers and a
            # client that went away are not EPP errors: the reference records neither (a cancelled stream returns
            # no error).
            m.record_error(req.model, req.target_model, ErrorCode.UPSTREAM.value, req.fairness_id, req.priority)

    def record_rejection(self, exc: EppError, request: InferenceRequest | None = None,
                         obs: Observation | None = None) -> None:
        """A request refused, by parsing, admission or scheduling here or by a front end (body too large, no
        endpoint for a bodiless request, an internal failure): counted in the error metric under ``exc``'s code,
        with empty model labels when the body was never parsed (as the reference records it); ``obs`` (tracing
        or the access log on) logs it and ends its spans."""
        if obs is not None:
            obs.refused(exc, request)
        if self.metrics is not None:
            if request is None:
                self.metrics.record_error("", "", exc.code.value, "", 0)
            else:
                self.metrics.record_error(request.model, request.target_model, exc.code.value, request.fairness_id,
                                          request.priority)


def _ip_of(hostport: str) -> str:
    """The IP part of ``ip``, ``ip:port`` or ``[v6]:port`` (subset hints match by IP only, as the reference)."""
    if hostport.startswith("["):
        return hostport[1:].split("]", 1)[0]
    return hostport.rsplit(":", 1)[0] if hostport.count(":") == 1 else hostport
