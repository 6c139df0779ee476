"""``endpoint-attribute-filter`` (Alpha): keeps endpoints by one numeric endpoint attribute.

The attribute is the endpoint's ``core-metrics-extractor`` custom metric of that ``attributeKey``
(:attr:`Metrics.custom <epp.framework.endpoint.Metrics.custom>`), or with another ``producer``
``Endpoint.attributes["<attribute>/<producer>"]``; a value that is not a number counts as missing. Algorithms
(``v`` = the endpoint's value; endpoints without one are kept or dropped by ``onMissing``, ``Pass`` by default, and
take no part in ranking)::

    threshold:  keep v <op> value          op: LessThan LessThanOrEqual GreaterThan GreaterThanOrEqual Equal NotEqual
    range:      keep min <= v <= max       (min <= max required)
    topK:       keep the k highest v (higherIsBetter) or the k lowest; all of them when k >= their number
    percentile: cutoff = sorted-ascending v at rank ceil(P/100 x N) (1-based nearest rank, clamped to [1, N]);
                keep v >= cutoff (higherIsBetter) or v <= cutoff
    result = candidates if (nothing kept and fallbackOnEmpty) else kept

YAML::

    - type: endpoint-attribute-filter
      parameters:
        attribute: num_requests_running       # a core-metrics-extractor customMetrics attributeKey
        onMissing: Pass                       # or Fail
        fallbackOnEmpty: true
        algorithm:
          type: threshold                     # or range / topK / percentile
          threshold: {operator: LessThan, value: 10}
          # range: {min: 4096, max: 131072}
          # topK: {k: 5, higherIsBetter: true}
          # percentile: {percentile: 25, higherIsBetter: false}
"""

from __future__ import annotations

import operator
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Literal, Mapping, NoReturn

from pydantic import Field

from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Filter, Handle
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

__all__ = ["EndpointAttributeFilter", "AttributeReader", "attribute_reader", "CORE_METRICS_PRODUCER"]

CORE_METRICS_PRODUCER = "core-metrics-extractor"
"""The producer whose attributes are the custom metrics (``Metrics.custom``)."""

AttributeReader = Callable[[Endpoint], "float | None"]

_OPERATORS: Mapping[str, Callable[[float, float], bool]] = MappingProxyType({
    "LessThan": operator.lt, "LessThanOrEqual": operator.le, "GreaterThan": operator.gt,
    "GreaterThanOrEqual": operator.ge, "Equal": operator.eq, "NotEqual": operator.ne,
})


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a real number (bools are not), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def attribute_reader(attribute: str, producer: str | None) -> AttributeReader:
    """The reader of one configured attribute (see the module docstring); raises ValueError for an
    ``attribute`` containing ``/`` when ``producer`` is None (omitted)."""
    if producer is None and "/" in attribute:
        head, _, tail = attribute.rpartition("/")
        raise ValueError(f"attribute '{attribute}' contains '/' but no producer is set; the attribute and its "
                         f"producer are separate parameters: split it into attribute: '{head}' and producer: "
                         f"'{tail}', or set producer explicitly if the name itself contains '/'")
    if producer is None or producer == CORE_METRICS_PRODUCER:
        return lambda ep: ep.metrics.custom.get(attribute)
    key = f"{attribute}/{producer}" if producer else attribute
    return lambda ep: _number(ep.attributes.get(key))


class ThresholdParams(PluginParams):
    operator: Literal["LessThan", "LessThanOrEqual", "GreaterThan", "GreaterThanOrEqual", "Equal", "NotEqual"]
    value: float = 0.0


class RangeParams(PluginParams):
    min: float = 0.0
    max: float = 0.0


class TopKParams(PluginParams):
    k: int = 0
    higher_is_better: bool = Field(False, alias="higherIsBetter")


class PercentileParams(PluginParams):
    percentile: float = 0.0
    higher_is_better: bool = Field(False, alias="higherIsBetter")


class AlgorithmParams(PluginParams):
    type: str = ""
    threshold: ThresholdParams | None = None
    range: RangeParams | None = None
    top_k: TopKParams | None = Field(None, alias="topK")
    percentile: PercentileParams | None = None


Valued = list[tuple[Endpoint, float]]


class EndpointAttributeFilter:
    """Keeps the endpoints whose attribute satisfies the algorithm; those without it per ``onMissing``."""

    type_name: ClassVar[str] = "endpoint-attribute-filter"

    class Params(PluginParams):
        attribute: str = ""
        producer: str | None = None
        on_missing: Literal["", "Pass", "Fail"] = Field("Pass", alias="onMissing")
        fallback_on_empty: bool = Field(False, alias="fallbackOnEmpty")
        algorithm: AlgorithmParams = Field(default_factory=AlgorithmParams)

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        if not params.attribute:
            self._fail("endpoint attribute filter requires a non-empty attribute", "attribute")
        self._keep_missing = params.on_missing != "Fail"
        self._test: Callable[[float], bool] = lambda v: True
        self._rank: Callable[[Valued], list[Endpoint]] | None = None
        self._algorithm(params.algorithm)
        try:
            self._read = attribute_reader(params.attribute, params.producer)
        except ValueError as exc:
            self._fail(f"endpoint attribute filter: {exc}", "attribute")

    def _fail(self, message: str, field: str) -> NoReturn:
        raise ConfigError(f"plugin '{self.name}' (type: {self.type_name}): {message}", plugin=self.name, field=field)

    def _algorithm(self, algo: AlgorithmParams) -> None:
        """Set ``_test`` (a per-value test: threshold, range) or ``_rank`` (a selection over all the values: topK,
        percentile), after the reference's checks."""
        kind = algo.type
        block = {"threshold": algo.threshold, "range": algo.range, "topK": algo.top_k,
                 "percentile": algo.percentile}
        if kind not in block:
            self._fail(f"endpoint attribute filter algorithm.type must be one of 'threshold', 'range', 'topK', "
                       f"'percentile', got '{kind}'", "algorithm.type")
        if block[kind] is None:
            self._fail(f"endpoint attribute filter requires algorithm.{kind} when algorithm.type is '{kind}'",
                       f"algorithm.{kind}")
        if kind == "threshold" and algo.threshold is not None:
            compare, bound = _OPERATORS[algo.threshold.operator], algo.threshold.value
            self._test = lambda v: compare(v, bound)
        elif kind == "range" and algo.range is not None:
            self._test = self._range(algo.range)
        elif kind == "topK" and algo.top_k is not None:
            self._rank = self._top_k(algo.top_k)
        elif algo.percentile is not None:
            self._rank = self._percentile(algo.percentile)

    def _range(self, r: RangeParams) -> Callable[[float], bool]:
        if r.min > r.max:
            self._fail(f"endpoint attribute filter range requires min <= max, got min {r.min:g}, max {r.max:g}",
                       "algorithm.range")
        low, high = r.min, r.max
        return lambda v: low <= v <= high

    def _top_k(self, t: TopKParams) -> Callable[[Valued], list[Endpoint]]:
        if t.k <= 0:
            self._fail(f"endpoint attribute filter topK.k must be a positive integer, got {t.k}", "algorithm.topK.k")
        k, sign = t.k, (-1.0 if t.higher_is_better else 1.0)

        def select(valued: Valued) -> list[Endpoint]:
            if len(valued) <= k:
                return [ep for ep, _ in valued]
            return [ep for ep, _ in sorted(valued, key=lambda pair: sign * pair[1])[:k]]
        return select

    def _percentile(self, p: PercentileParams) -> Callable[[Valued], list[Endpoint]]:
        if not 0 <= p.percentile <= 100:
            self._fail(f"endpoint attribute filter percentile.percentile must be in [0, 100], got {p.percentile:g}",
                       "algorithm.percentile.percentile")
        share, higher = p.percentile / 100.0, p.higher_is_better

        def select(valued: Valued) -> list[Endpoint]:
            if not valued:
                return []
            ordered = sorted(valued, key=lambda pair: pair[1])
            # the reference's ceil: int(x + 0.999999), so float noise above an integer does not add a rank
            rank = min(max(int(share * len(ordered) + 0.999999), 1), len(ordered))
            cutoff = ordered[rank - 1][1]
            return [ep for ep, v in ordered if (v >= cutoff if higher else v <= cutoff)]
        return select

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        rank = self._rank
        kept = self._ranked(endpoints, rank) if rank is not None else self._tested(endpoints)
        if not kept and self.params.fallback_on_empty:
            return endpoints
        return kept

    def _tested(self, endpoints: list[Endpoint]) -> list[Endpoint]:
        """Threshold and range: candidate order, each endpoint on its own value (or ``onMissing``)."""
        read, test, keep_missing = self._read, self._test, self._keep_missing
        out: list[Endpoint] = []
        for ep in endpoints:
            value = read(ep)
            if keep_missing if value is None else test(value):
                out.append(ep)
        return out

    def _ranked(self, endpoints: list[Endpoint], rank: Callable[[Valued], list[Endpoint]]) -> list[Endpoint]:
        """topK and percentile: the selection among the endpoints with a value, then the missing ones if kept."""
        valued: Valued = []
        missing: list[Endpoint] = []
        for ep in endpoints:
            value = self._read(ep)
            if value is None:
                missing.append(ep)
            else:
                valued.append((ep, value))
        kept = rank(valued)
        return kept + missing if self._keep_missing else kept


_check: type[Filter] = EndpointAttributeFilter
