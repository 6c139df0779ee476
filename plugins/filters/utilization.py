"""``utilization-filter`` (Alpha): drops endpoints over any configured utilization cap.

An endpoint is kept only if every condition holds; missing data counts as 0::

    keep(e) = all(value(e, c.metric) <= c.maxValue for c in conditions)
    result  = candidates if (no endpoint kept and fallbackOnEmpty) else kept

Metrics: ``active-requests`` (EPP's in-flight requests to the endpoint), ``running-requests`` and ``waiting-queue``
(scraped), ``kv-cache-utilization`` (scraped, a fraction in [0, 1]).

YAML::

    - type: utilization-filter
      parameters:
        conditions:
        - {metric: waiting-queue, maxValue: 16}
        - {metric: kv-cache-utilization, maxValue: 0.9}
        - {metric: active-requests, maxValue: 64}
        fallbackOnEmpty: true      # default false: an empty result fails the profile
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable, ClassVar, Literal, Mapping, NoReturn

from pydantic import Field

from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Filter, Handle
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

from ..producers.inflight_load import check_load_producer_name

__all__ = ["UtilizationFilter", "UtilizationCondition", "METRIC_READERS"]

Metric = Literal["active-requests", "running-requests", "waiting-queue", "kv-cache-utilization"]

METRIC_READERS: Mapping[str, Callable[[Endpoint], float]] = MappingProxyType({
    "active-requests": lambda ep: float(ep.inflight_requests),
    "running-requests": lambda ep: float(ep.metrics.running),
    "waiting-queue": lambda ep: float(ep.metrics.waiting),
    "kv-cache-utilization": lambda ep: ep.metrics.kv_usage,
})
"""How each metric name reads an endpoint."""


class UtilizationCondition(PluginParams):
    """One cap: the endpoint passes while its ``metric`` is at most ``maxValue``."""

    metric: Metric
    max_value: float | None = Field(None, alias="maxValue")


class UtilizationFilter:
    """Keeps the endpoints that satisfy every condition; all of them if none does and ``fallbackOnEmpty``."""

    type_name: ClassVar[str] = "utilization-filter"

    class Params(PluginParams):
        conditions: list[UtilizationCondition] = Field(default_factory=list)
        fallback_on_empty: bool = Field(False, alias="fallbackOnEmpty")
        in_flight_load_producer_name: str | None = Field(None, alias="inFlightLoadProducerName")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._caps = [(METRIC_READERS[c.metric], self._checked_cap(i, c)) for i, c in enumerate(params.conditions)]
        if not self._caps:
            self._fail("utilization filter requires at least one condition", "conditions")

    def _checked_cap(self, index: int, cond: UtilizationCondition) -> float:
        """The condition's ``maxValue``, after the reference's checks."""
        field = f"conditions.{index}.maxValue"
        if cond.max_value is None:
            self._fail(f"utilization filter condition for '{cond.metric}' requires maxValue", field)
        cap = float(cond.max_value)
        if cap < 0:
            self._fail(f"utilization filter condition for '{cond.metric}' requires a non-negative maxValue, "
                       f"got {cap:g}", field)
        if cond.metric == "kv-cache-utilization" and cap > 1:
            self._fail(f"utilization filter maxValue for 'kv-cache-utilization' is a fraction and must be at most "
                       f"1, got {cap:g}", field)
        return cap

    def _fail(self, message: str, field: str) -> NoReturn:
        raise ConfigError(f"plugin '{self.name}' (type: {self.type_name}): {message}", plugin=self.name, field=field)

    def bind(self, handle: Handle) -> None:
        """Check ``inFlightLoadProducerName``, which only matters when a condition reads ``active-requests``."""
        if any(c.metric == "active-requests" for c in self.params.conditions):
            check_load_producer_name(self, handle, self.params.in_flight_load_producer_name)

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        caps = self._caps
        kept = [ep for ep in endpoints if all(read(ep) <= cap for read, cap in caps)]
        if not kept and self.params.fallback_on_empty:
            return endpoints
        return kept


_check: type[Filter] = UtilizationFilter
