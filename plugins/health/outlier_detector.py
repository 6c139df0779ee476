"""``outlier-detector``: passive health. Endpoints that fail real requests are ejected, then probed back in.

Fed by the Director with every upstream attempt's outcome (both front ends): a 5xx, a connect failure, a timeout,
Envoy moving a request on to the next endpoint, or (with ``firstByteTimeout``) a streamed answer without a first
byte in time count as failures; any other answer, a 4xx included, is a success; a 429 or a client that went away
is neither (docs/health.md has the table); a success of a request that began before the endpoint's current
failure streak does not end the streak (streams started before a wedge still finish). An endpoint is ejected after ``consecutiveFailures`` failures in a row, or when ``interval``'s attempts
number at least ``failurePercentageRequestVolume`` and ``failurePercentageThreshold`` percent of them failed. An
ejection lasts ``baseEjectionTime`` times the times it was ejected (reset after ``maxEjectionTime`` without one),
at most ``maxEjectionTime``; then a probe (one token from ``probePath``, for a model the endpoint serves) readmits
it or ejects it again, longer. At most ``maxEjectionPercent`` of the pool is ejected at once (at least one
endpoint, never the last), and a request whose candidates are all ejected is routed among them anyway. While an
endpoint is on a failure streak, it gets no new request once its streak plus its requests in flight reach
``consecutiveFailures`` (when another endpoint is left): so at most that many requests meet a server that has
started failing before it is ejected, however fast they arrive. YAML::

    - type: outlier-detector          # EPP adds one with these defaults when the config has none
      parameters:
        consecutiveFailures: 5        # 0: off
        failurePercentageThreshold: null   # 1-100: on
        failurePercentageRequestVolume: 20
        interval: 10s
        baseEjectionTime: 30s
        maxEjectionTime: 300s
        maxEjectionPercent: 50
        firstByteTimeout: null        # e.g. 60s
        probePath: /v1/completions
        probeTimeout: 10s
        probeConcurrency: 4
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from typing import Callable, ClassVar

from pydantic import Field, field_validator

from epp.config.units import Duration
from epp.datalayer.models import stored_models
from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import EjectionListener, Handle, Outcome, PassiveHealth, PluginService
from epp.framework.plugins import Params as PluginParams
from epp.framework.pool import EndpointPool

from ._probe import Prober

__all__ = ["OutlierDetector", "CONSECUTIVE", "RATE", "PROBE_FAILED"]

log = logging.getLogger("epp.plugins.health")

CONSECUTIVE = "consecutive_failures"
RATE = "failure_rate"
PROBE_FAILED = "probe_failed"
_BUCKETS = 10  # the failure-rate window is kept as this many buckets of interval/10 each


class _State:
    """One endpoint's record: its failure streak, its window of recent outcomes, and its ejection."""

    __slots__ = ("endpoint", "streak", "since", "window", "until", "times", "readmitted", "model", "probing")

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.streak = 0
        self.since = 0.0  # when the streak's first failure was seen
        self.window: deque[list[float]] = deque()  # [bucket start, successes, failures], oldest first
        self.until: float | None = None  # ejected until then; None while admitted
        self.times = 0  # ejections so far (the backoff multiplier)
        self.readmitted = -math.inf
        self.model = ""  # the last model routed here: what a probe asks for when none is known to be served
        self.probing = False


class OutlierDetector:
    """Ejects endpoints that fail requests and readmits them with a probe (see the module docstring)."""

    type_name: ClassVar[str] = "outlier-detector"

    class Params(PluginParams):
        consecutive_failures: int = Field(5, ge=0, alias="consecutiveFailures")
        failure_percentage_threshold: int | None = Field(None, ge=1, le=100, alias="failurePercentageThreshold")
        failure_percentage_request_volume: int = Field(20, ge=1, alias="failurePercentageRequestVolume")
        interval: Duration = 10.0
        base_ejection_time: Duration = Field(30.0, alias="baseEjectionTime")
        max_ejection_time: Duration = Field(300.0, alias="maxEjectionTime")
        max_ejection_percent: int = Field(50, ge=0, le=100, alias="maxEjectionPercent")
        first_byte_timeout: Duration | None = Field(None, alias="firstByteTimeout")
        probe_path: str = Field("/v1/completions", alias="probePath")
        probe_timeout: Duration = Field(10.0, alias="probeTimeout")
        probe_concurrency: int = Field(4, ge=1, alias="probeConcurrency")

        @field_validator("interval", "base_ejection_time", "max_ejection_time", "first_byte_timeout",
                         "probe_timeout")
        @classmethod
        def _positive(cls, v: float | None) -> float | None:
            if v is not None and v <= 0:
                raise ValueError("must be a positive duration")
            return v

        @field_validator("probe_path")
        @classmethod
        def _rooted(cls, v: str) -> str:
            return v if v.startswith("/") else "/" + v

    def __init__(self, name: str, params: Params, handle: Handle | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if params.max_ejection_time < params.base_ejection_time:
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): maxEjectionTime must not be below "
                              "baseEjectionTime", plugin=name, field="maxEjectionTime")
        self.name = name
        self.params = params
        self.clock = clock
        self._states: dict[str, _State] = {}
        self._ejected: dict[str, _State] = {}
        self._streaking: dict[str, _State] = {}  # admitted endpoints whose last outcome was a failure
        self._listeners: list[EjectionListener] = []
        self._pool: EndpointPool | None = None
        self._largest = 0  # before start: the largest candidate list seen stands for the pool's size
        self._prober = Prober(params.probe_path, params.probe_timeout)
        self._task: asyncio.Task[None] | None = None
        self._probes: set[asyncio.Task[None]] = set()
        self._wake: asyncio.Event | None = None  # made in start(): it belongs to the loop the service runs on

    @property
    def first_byte_timeout(self) -> float | None:
        return self.params.first_byte_timeout

    def on_ejection(self, listener: EjectionListener) -> None:
        self._listeners.append(listener)

    def ejected(self) -> list[str]:
        """Names of the endpoints ejected now."""
        return list(self._ejected)

    # -- the request path ---------------------------------------------------------------------------------------

    def admissible(self, endpoints: list[Endpoint]) -> list[Endpoint]:
        if len(endpoints) > self._largest:
            self._largest = len(endpoints)
        if not self._ejected and not self._streaking:
            return endpoints
        if self._ejected and self._task is None:
            self._lapse()
        kept = [ep for ep in endpoints if ep.name not in self._ejected]
        if self._streaking:
            # A streak's in-flight requests are likely failures to come: hold new ones back until it ends.
            clear = [ep for ep in kept if not self._held_back(ep)]
            kept = clear or kept
        return kept or endpoints  # ejection never leaves a request without an endpoint

    def _held_back(self, endpoint: Endpoint) -> bool:
        """Whether ``endpoint``'s failure streak plus its requests in flight reach ``consecutiveFailures``."""
        state = self._streaking.get(endpoint.name)
        limit = self.params.consecutive_failures
        return (state is not None and state.endpoint is endpoint and limit > 0
                and state.streak + endpoint.inflight_requests >= limit)

    def observe(self, endpoint: Endpoint, outcome: Outcome, model: str, started: float | None = None) -> None:
        state = self._states.get(endpoint.name)
        if state is None or state.endpoint is not endpoint:  # new, or the name now has another address
            if state is not None and self._ejected.pop(endpoint.name, None) is not None:
                self._notify(state.endpoint, None)
            self._streaking.pop(endpoint.name, None)
            state = self._states[endpoint.name] = _State(endpoint)
        if model:
            state.model = model
        if state.until is not None:
            return  # ejected: a request that was already on its way says nothing the probe will not
        failed = outcome is not Outcome.SUCCESS
        if not failed and state.streak and started is not None and started < state.since:
            return  # began before the server started failing (a long stream finishing): says nothing of it now
        if failed and not state.streak:
            state.since = self.clock()
        state.streak = state.streak + 1 if failed else 0
        if failed:
            self._streaking[endpoint.name] = state
        else:
            self._streaking.pop(endpoint.name, None)
        p = self.params
        if p.consecutive_failures and state.streak >= p.consecutive_failures:
            self._try_eject(state, CONSECUTIVE, outcome, self.clock())
        elif p.failure_percentage_threshold is not None:
            now = self.clock()
            if self._count(state, failed, now):
                self._try_eject(state, RATE, outcome, now)

    def _count(self, state: _State, failed: bool, now: float) -> bool:
        """Add the outcome to ``state``'s window; True when the window's failure percentage calls for ejection."""
        width = self.params.interval / _BUCKETS
        window = state.window
        while window and window[0][0] <= now - self.params.interval:
            window.popleft()
        if not window or window[-1][0] + width <= now:
            window.append([now, 0, 0])
        window[-1][2 if failed else 1] += 1
        if not failed:
            return False
        ok = sum(b[1] for b in window)
        bad = sum(b[2] for b in window)
        threshold = self.params.failure_percentage_threshold or 101
        return ok + bad >= self.params.failure_percentage_request_volume and bad * 100 >= threshold * (ok + bad)

    # -- ejection and readmission -------------------------------------------------------------------------------

    def _room(self) -> int:
        """How many endpoints may be ejected at once: ``maxEjectionPercent`` of the pool, at least one, never all."""
        size = len(self._pool.endpoints()) if self._pool is not None else self._largest
        if size <= 1 or self.params.max_ejection_percent == 0:
            return 0
        return min(size - 1, max(1, size * self.params.max_ejection_percent // 100))

    def _try_eject(self, state: _State, reason: str, outcome: Outcome, now: float) -> None:
        if len(self._ejected) >= self._room():
            log.warning("endpoint %s is failing (%s, last: %s) but stays in: %d of the pool's endpoints are "
                        "ejected already (maxEjectionPercent)", state.endpoint.name, reason, outcome.value,
                        len(self._ejected))
            state.streak = 0  # the next streak tries again
            self._streaking.pop(state.endpoint.name, None)
            return
        seconds = self._eject(state, reason, now)
        log.warning("endpoint %s ejected for %gs (%s, last: %s)", state.endpoint.name, seconds, reason,
                    outcome.value)

    def _eject(self, state: _State, reason: str, now: float) -> float:
        p = self.params
        if now - state.readmitted >= p.max_ejection_time:
            state.times = 0  # a quiet stretch as long as the longest ejection forgives the past ones
        state.times += 1
        seconds = min(p.base_ejection_time * state.times, p.max_ejection_time)
        state.until = now + seconds
        state.streak = 0
        self._streaking.pop(state.endpoint.name, None)
        state.window.clear()
        self._ejected[state.endpoint.name] = state
        if self._wake is not None:
            self._wake.set()  # the service sleeps until the next ejection runs out: this one may be sooner
        self._notify(state.endpoint, reason)
        return seconds

    def _readmit(self, state: _State, now: float) -> None:
        state.until = None
        state.readmitted = now
        state.streak = 0
        state.window.clear()
        self._ejected.pop(state.endpoint.name, None)
        self._notify(state.endpoint, None)

    def _lapse(self) -> None:
        """Without the probe service (EPP not started: a test, an embedding), ejections simply run out."""
        now = self.clock()
        for state in [s for s in self._ejected.values() if s.until is not None and s.until <= now]:
            self._readmit(state, now)

    def _notify(self, endpoint: Endpoint, reason: str | None) -> None:
        for listener in self._listeners:
            listener(endpoint, reason)

    def _forget(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        """The pool changed: an endpoint that left takes its record with it."""
        for endpoint in removed:
            state = self._states.get(endpoint.name)
            if state is not None and state.endpoint is endpoint:
                del self._states[endpoint.name]
                self._streaking.pop(endpoint.name, None)
                if self._ejected.pop(endpoint.name, None) is not None:
                    self._notify(endpoint, None)

    # -- the probe service --------------------------------------------------------------------------------------

    async def start(self, pool: EndpointPool) -> None:
        """Probe ejected endpoints when their time is up; ``pool`` sizes the ejection cap."""
        if self._task is not None:
            return
        self._pool = pool
        pool.subscribe(self._forget)
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(self._wake), name=f"epp-{self.name}-probes")

    async def stop(self) -> None:
        task, self._task = self._task, None
        for t in [*([task] if task is not None else []), *self._probes]:
            t.cancel()
        await asyncio.gather(*([task] if task is not None else []), *self._probes, return_exceptions=True)
        self._probes.clear()
        await self._prober.close()

    async def _run(self, wake: asyncio.Event) -> None:
        gate = asyncio.Semaphore(self.params.probe_concurrency)
        while True:
            wake.clear()
            now = self.clock()
            waiting = [s for s in self._ejected.values() if not s.probing and s.until is not None]
            for state in waiting:
                if state.until is not None and state.until <= now:
                    state.probing = True
                    task = asyncio.create_task(self._probe(state, gate))
                    self._probes.add(task)
                    task.add_done_callback(self._probes.discard)
            due = [s.until for s in waiting if not s.probing and s.until is not None]
            try:
                await asyncio.wait_for(wake.wait(), max(0.0, min(due) - now) if due else None)
            except TimeoutError:
                pass

    async def _probe(self, state: _State, gate: asyncio.Semaphore) -> None:
        try:
            async with gate:
                model = self._model(state)
                ok = True if not model else await self._prober.probe(state.endpoint, model)
        finally:
            state.probing = False
        if self._ejected.get(state.endpoint.name) is not state:
            return  # forgotten meanwhile
        now = self.clock()
        if ok:
            self._readmit(state, now)
            log.info("endpoint %s readmitted%s", state.endpoint.name, "" if model else
                     " without a probe (no model known to ask it for)")
        else:
            self._ejected.pop(state.endpoint.name)
            seconds = self._eject(state, PROBE_FAILED, now)
            log.warning("endpoint %s failed its probe: ejected again for %gs", state.endpoint.name, seconds)

    @staticmethod
    def _model(state: _State) -> str:
        """A model to probe with: a base model the endpoint serves (``/v1/models``; an adapter may have been
        unloaded), else the last one routed there."""
        served = stored_models(state.endpoint) or ()
        return next((m.id for m in served if not m.parent), state.model)


_check: type[PassiveHealth] = OutlierDetector
_check_service: type[PluginService] = OutlierDetector
