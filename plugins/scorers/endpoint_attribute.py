"""``endpoint-attribute-scorer`` (Alpha): scores endpoints by one numeric endpoint attribute.

The attribute is the endpoint's custom metric ``attributeKey`` (:attr:`Metrics.custom
<epp.framework.endpoint.Metrics.custom>`, a ``core-metrics-extractor`` ``customMetrics`` entry); an endpoint whose
scrape lacks it scores 0. Formula (``v`` = the value)::

    adaptiveRange (default): lo, hi = min and max of v over the candidates that have it
                             s = (v - lo) / (hi - lo)            # 1.0 for all of them when hi == lo
    fixedRange {min, max}:   s = clamp((v - min) / (max - min), 0, 1)
    score = 1 - s  (linear_lower_is_better)   or   s  (linear_higher_is_better)

YAML::

    - type: endpoint-attribute-scorer
      parameters:
        attributeKey: queue_depth           # a core-metrics-extractor customMetrics attributeKey
        algorithm:
          type: linear_lower_is_better      # or linear_higher_is_better
          normalization:
            fixedRange: {min: 0, max: 64}   # or adaptiveRange: {} (the default)
"""

from __future__ import annotations

from typing import ClassVar, Literal, NoReturn

from pydantic import Field

from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, Scorer
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

from ..filters.endpoint_attribute import CORE_METRICS_PRODUCER, attribute_reader

__all__ = ["EndpointAttributeScorer"]

_ALGORITHMS = ("linear_lower_is_better", "linear_higher_is_better")


class FixedRangeParams(PluginParams):
    min: float = 0.0
    max: float = 0.0


class AdaptiveRangeParams(PluginParams):
    """Takes no fields: the range is the candidates' own."""


class NormalizationParams(PluginParams):
    fixed_range: FixedRangeParams | None = Field(None, alias="fixedRange")
    adaptive_range: AdaptiveRangeParams | None = Field(None, alias="adaptiveRange")


class ScorerAlgorithmParams(PluginParams):
    type: str = ""
    normalization: NormalizationParams = Field(default_factory=NormalizationParams)


class EndpointAttributeScorer:
    """Linear score of a custom-metric attribute, normalised to a fixed or the candidates' range; missing = 0."""

    type_name: ClassVar[str] = "endpoint-attribute-scorer"

    class Params(PluginParams):
        attribute_key: str = Field("", alias="attributeKey")
        algorithm: ScorerAlgorithmParams = Field(default_factory=ScorerAlgorithmParams)
        source: Literal["", "endpoint", "metadata"] = ""
        metadata_namespace: str = Field("", alias="metadataNamespace")
        metadata_field: str = Field("", alias="metadataField")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._check_source(params)
        algo = params.algorithm
        if algo.type not in _ALGORITHMS:
            self._fail(f"endpoint attribute scorer algorithm.type must be 'linear_lower_is_better' or "
                       f"'linear_higher_is_better', got '{algo.type}'", "algorithm.type")
        norm = algo.normalization
        if norm.fixed_range is not None and norm.adaptive_range is not None:
            self._fail("endpoint attribute scorer allows at most one normalization strategy, got both fixedRange "
                       "and adaptiveRange", "algorithm.normalization")
        fixed = norm.fixed_range
        if fixed is not None and fixed.min >= fixed.max:
            self._fail(f"endpoint attribute scorer normalization.fixedRange requires min < max, got min "
                       f"{fixed.min:g}, max {fixed.max:g}", "algorithm.normalization.fixedRange")
        self._fixed = fixed
        self._lower_is_better = algo.type == "linear_lower_is_better"
        self._read = attribute_reader(params.attribute_key, CORE_METRICS_PRODUCER)

    def _check_source(self, params: Params) -> None:
        if params.source == "metadata":
            if not params.metadata_namespace or not params.metadata_field:
                self._fail("endpoint attribute scorer with source: metadata requires metadataNamespace and "
                           "metadataField", "metadataNamespace")
            self._fail("source 'metadata' is not supported: EPP does not pass the request's dynamic metadata to "
                       "scorers (use source: endpoint with a core-metrics-extractor customMetrics attribute)",
                       "source")
        if not params.attribute_key:
            self._fail("endpoint attribute scorer requires a non-empty attributeKey", "attributeKey")

    def _fail(self, message: str, field: str) -> NoReturn:
        raise ConfigError(f"plugin '{self.name}' (type: {self.type_name}): {message}", plugin=self.name, field=field)

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        values = [self._read(ep) for ep in endpoints]
        present = [v for v in values if v is not None]
        if not present:
            return [0.0] * len(endpoints)
        if self._fixed is not None:
            lo, hi = self._fixed.min, self._fixed.max
        else:
            lo, hi = min(present), max(present)
        return [0.0 if v is None else self._linear(v, lo, hi) for v in values]

    def _linear(self, value: float, lo: float, hi: float) -> float:
        """``value`` on [lo, hi] as [0, 1] (clamped), inverted for lower-is-better; 1.0 when the range is a point
        (only the adaptive range can be)."""
        if hi == lo:
            return 1.0
        s = min(1.0, max(0.0, (value - lo) / (hi - lo)))
        return 1.0 - s if self._lower_is_better else s


_check: type[Scorer] = EndpointAttributeScorer
