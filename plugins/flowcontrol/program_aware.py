"""``program-aware-fairness``: a fairness policy that picks which program's flow of a band goes next from
per-program metrics accumulated over the request lifecycle, rather than per-request attributes.

A *program* is a fairness id (``default-flow`` without one); each gets its own flow in a band. The plugin is the
band's selector (strategy ``las`` or ``turn-priority``: :mod:`.program_aware_strategies`) and also a PreRequest hook
(counts the dispatch and the queue wait into the program's mean wait) and a ResponseComplete hook (ends the request
and charges its weighted tokens, input x1 and output x2, to the strategy). Idle programs are forgotten after
``evictionTtlSeconds`` by a sweep run from the hooks, with their Prometheus series.

YAML::

    featureGates: [flowControl]
    plugins:
    - type: program-aware-fairness
      parameters:
        strategy: las             # or turn-priority
        lasWeightService: 0.8
        lasWeightHeadWait: 0.2
        lasHalfLifeSeconds: 60    # 0: no decay
        turnPriorityTimeWeight: 0.5
        turnPriorityInactivitySeconds: 120
        evictionTtlSeconds: 3600  # 0: never evict
        evictionSweepSeconds: 300
    flowControl:
      defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness}
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import Field

from epp.errors import ConfigError
from epp.flowcontrol.policies import Choice, FairnessPolicy, FlowSelector, Ready
from epp.flowcontrol.queues import Flow
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import Handle, Params, ResponseInfo, SchedulingResult
from epp.framework.request import InferenceRequest

from .program_aware_strategies import (
    LAS,
    STRATEGIES,
    TURN_PRIORITY,
    LasStrategy,
    ProgramMetrics,
    QueueInfo,
    Strategy,
    TurnPriorityStrategy,
    weighted_cost,
)

__all__ = ["ProgramAwareFairnessPolicy", "ProgramAwareCollector", "jain_fairness_index", "METRIC_PREFIX"]

METRIC_PREFIX = "llm_d_epp_program_aware_"


class ProgramAwareParams(Params):
    strategy: str = LAS
    las_weight_service: float = Field(0.8, alias="lasWeightService")
    las_weight_head_wait: float = Field(0.2, alias="lasWeightHeadWait")
    las_half_life_seconds: float = Field(60.0, alias="lasHalfLifeSeconds")
    turn_priority_time_weight: float = Field(0.5, alias="turnPriorityTimeWeight")
    turn_priority_inactivity_seconds: float = Field(120.0, alias="turnPriorityInactivitySeconds")
    eviction_ttl_seconds: float = Field(3600.0, alias="evictionTtlSeconds")
    eviction_sweep_seconds: float = Field(300.0, alias="evictionSweepSeconds")


_NON_NEGATIVE = ("eviction_ttl_seconds", "las_weight_service", "las_weight_head_wait", "las_half_life_seconds",
                 "turn_priority_time_weight", "turn_priority_inactivity_seconds")


@dataclass(slots=True)
class _Stash:
    enqueue_time: float
    stashed_at: float


class ProgramAwareFairnessPolicy:
    """Fairness between programs (fairness ids) by accumulated per-program metrics; see the module docstring.

    Program state is shared by every band the plugin serves (as the reference's). ``clock`` must be the flow
    controller's (monotonic seconds, the default of both): queue waits and inactivity compare enqueue times with
    it.
    """

    type_name: ClassVar[str] = "program-aware-fairness"
    Params = ProgramAwareParams

    def __init__(self, name: str, params: ProgramAwareParams, handle: Handle | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.params = params
        _validate(name, params)
        self.strategy: Strategy = (
            LasStrategy(params.las_weight_service, params.las_weight_head_wait, params.las_half_life_seconds)
            if params.strategy in ("", LAS) else
            TurnPriorityStrategy(params.turn_priority_time_weight, params.turn_priority_inactivity_seconds))
        self.clock = clock
        self.programs: dict[str, ProgramMetrics] = {}
        self._stash: dict[str, _Stash] = {}
        self._next_sweep = clock() + params.eviction_sweep_seconds

    # -- fairness policy -----------------------------------------------------------------------------------

    def new_selector(self) -> FlowSelector:
        """A selector for one band; every band's selector shares this plugin's program state."""
        return _ProgramSelector(self)

    def choose(self, flows: Sequence[Flow], ready: Ready) -> Flow | None:
        """The strategy's pick among the ready flows (no side effects)."""
        queues = []
        for flow in flows:
            if not ready(flow):
                continue
            head = flow.queue.head()
            assert head is not None  # ready implies non-empty
            queues.append(QueueInfo(flow, flow.fairness_id, self.programs.get(flow.fairness_id), head.enqueue_time))
        return self.strategy.pick(queues, self.clock()) if queues else None

    def dispatching(self, flow: Flow) -> None:
        """``flow``'s head is being dispatched: note its enqueue time for PreRequest's queue wait."""
        head = flow.queue.head()
        if head is not None:
            self._stash[head.request.request_id] = _Stash(head.enqueue_time, self.clock())
        self._program(flow.fairness_id)

    # -- request hooks -------------------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """Count the dispatch and its queue wait (enqueue to now, whole milliseconds) for the request's program."""
        now = self.clock()
        stash = self._stash.pop(request.request_id, None)
        wait_ms = None if stash is None else float(math.floor(max(0.0, now - stash.enqueue_time) * 1000.0))
        self._program(request.fairness_id).record_dispatched(wait_ms)
        self._maybe_sweep(now)

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, info: ResponseInfo) -> None:
        """End the request: charge its weighted tokens to the strategy, then record the completion."""
        now = self.clock()
        program = self._program(request.fairness_id)
        cost = weighted_cost(info.prompt_tokens or 0, info.completion_tokens or 0)
        self.strategy.on_completed(request.fairness_id, cost, now)
        program.record_completion(now)
        self._maybe_sweep(now)

    # -- state ---------------------------------------------------------------------------------------------

    def _program(self, program_id: str) -> ProgramMetrics:
        program = self.programs.get(program_id)
        if program is None:
            program = self.programs[program_id] = ProgramMetrics(last_completion=self.clock())
        return program

    def _maybe_sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.params.eviction_sweep_seconds
        self.evict_idle(now)

    def evict_idle(self, now: float) -> list[str]:
        """Forget programs with nothing in flight whose last completion is older than ``evictionTtlSeconds`` (0:
        never), and enqueue times noted for requests that never reached PreRequest; returns the programs evicted."""
        ttl = self.params.eviction_ttl_seconds
        stale = [k for k, s in self._stash.items() if now - s.stashed_at > self.params.eviction_sweep_seconds]
        for key in stale:
            del self._stash[key]
        if ttl <= 0:
            return []
        idle = [pid for pid, m in self.programs.items() if m.inflight == 0 and now - m.last_completion > ttl]
        for pid in idle:
            del self.programs[pid]
            self.strategy.evict(pid)
        return idle

    def fairness_index(self) -> float:
        """Jain's fairness index over the mean queue wait of the programs that have one."""
        return jain_fairness_index([m.average_wait_ms for m in self.programs.values() if m.wait_count])

    @classmethod
    def metrics_collector(cls, instances: Sequence[ProgramAwareFairnessPolicy]) -> Collector:
        """One collector for every instance a flow-control config uses (see :func:`epp.flowcontrol.build`)."""
        return ProgramAwareCollector(instances)


class _ProgramSelector:
    """One band's view of the plugin: selection by the strategy, no per-band state."""

    def __init__(self, plugin: ProgramAwareFairnessPolicy) -> None:
        self._plugin = plugin

    def select(self, flows: Sequence[Flow], ready: Ready) -> Choice | None:
        flow = self._plugin.choose(flows, ready)
        return Choice(flow) if flow is not None else None

    def commit(self, choice: Choice) -> None:
        self._plugin.dispatching(choice.flow)


def jain_fairness_index(values: Sequence[float]) -> float:
    """``(sum x)^2 / (n * sum x^2)``: 1.0 when all are equal, and with fewer than two values or all zero."""
    total, squares = sum(values), sum(v * v for v in values)
    if len(values) <= 1 or squares == 0:
        return 1.0
    return total * total / (len(values) * squares)


class ProgramAwareCollector(Collector):
    """The ``llm_d_epp_program_aware_*`` families, read from the plugins' state at each collection (an evicted
    program's series disappear with it). With several instances, the index is the first one's and per-program
    series of the same program are the last one's (the reference's instances share one set of gauges)."""

    def __init__(self, plugins: Sequence[ProgramAwareFairnessPolicy]) -> None:
        self._plugins = list(plugins)

    def collect(self) -> Iterator[Metric]:
        index = GaugeMetricFamily(METRIC_PREFIX + "jains_fairness_index", "[ALPHA] Jain's fairness index over "
                                  "average wait time across active programs.",
                                  value=self._plugins[0].fairness_index() if self._plugins else 1.0)
        yield index
        waits: dict[str, float] = {}
        services: dict[str, float] = {}
        las = False
        for plugin in self._plugins:
            waits.update((pid, m.average_wait_ms) for pid, m in plugin.programs.items() if m.dispatched)
            values = plugin.strategy.gauge_values()
            if values is not None:
                las = True
                services.update(values)
        yield _per_program("avg_wait_time_milliseconds", "Cumulative mean of flow-control queue wait time per "
                           "program in milliseconds.", waits)
        if las:
            yield _per_program("attained_service_tokens", "Time-decayed attained service (weighted tokens "
                               "consumed) per program.", services)


def _per_program(suffix: str, text: str, values: dict[str, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(METRIC_PREFIX + suffix, "[ALPHA] " + text, labels=["program_id"])
    for pid in sorted(values):
        family.add_metric([pid], values[pid])
    return family


def _validate(name: str, params: ProgramAwareParams) -> None:
    """The reference's checks, in its order; errors name the plugin and the field."""
    prefix = f"plugin '{name}' (type: {ProgramAwareFairnessPolicy.type_name})"
    fields = ProgramAwareParams.model_fields
    for attr in ("eviction_ttl_seconds", "eviction_sweep_seconds", *_NON_NEGATIVE[1:]):
        value = getattr(params, attr)
        alias = fields[attr].alias or attr
        bad = value <= 0 if attr == "eviction_sweep_seconds" else value < 0
        if bad or not math.isfinite(value):
            rule = "> 0" if attr == "eviction_sweep_seconds" else ">= 0"
            raise ConfigError(f"{prefix}: {alias} must be {rule}, got {value:g}", plugin=name, field=alias)
    if params.strategy not in ("", *STRATEGIES):
        raise ConfigError(f'{prefix}: unknown scoring strategy "{params.strategy}": only "{LAS}" and '
                          f'"{TURN_PRIORITY}" are supported', plugin=name, field="strategy")


_check_policy: type[FairnessPolicy] = ProgramAwareFairnessPolicy
_check_selector: type[FlowSelector] = _ProgramSelector
