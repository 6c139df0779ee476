"""The names of the headers and ``envoy.lb`` metadata keys EPP manages, and their deprecated aliases.

Current llm-d-router renamed each of them to an ``x-llm-d-router-*`` name and still honours the Gateway API
Inference Extension's name as a deprecated alias (``pkg/epp/metadata/consts.go``, ``headerAliases``). EPP does the
same, with :data:`HEADER_ALIASES` as the one table:

* **Reading** (request headers, the ``envoy.lb.subset_hint`` subset list, the ``envoy.lb`` served endpoint): the
  current name first; the alias only when the current name is absent (present but empty still wins, as the
  reference's ``GetHeaderValue``). Header maps are lower-case (both front ends make them so; Envoy always does), so
  each lookup is two dict lookups at most, never a scan of the headers.
* **Writing** the routing decision (``x-llm-d-router-destination-endpoint`` header and ``envoy.lb`` key): both
  names, as the reference's ``generateHeaders``/``generateMetadata`` do, so Envoy and Gateway setups that route on
  the old ``x-gateway-destination-endpoint`` keep working. Likewise the drop reason of a rejected request
  (``x-llm-d-router-request-dropped-reason``, llm-d's earlier ``x-llm-d-request-dropped-reason`` beside it, as the
  reference's ``RequestDroppedReasonHeaders``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = [
    "FAIRNESS_ID_HEADER", "OBJECTIVE_HEADER", "MODEL_REWRITE_HEADER", "SLO_TTFT_HEADER", "SLO_TPOT_HEADER",
    "DESTINATION_HEADER", "SERVED_HEADER", "SUBSET_HEADER", "DROPPED_REASON_HEADER", "HEADER_ALIASES",
    "header_names", "header_value",
]

FAIRNESS_ID_HEADER = "x-llm-d-router-inference-fairness-id"
"""The flow-control tenant (fairness id); ``default-flow`` without it."""
OBJECTIVE_HEADER = "x-llm-d-router-inference-objective"
"""Names the request's InferenceObjective (its priority)."""
MODEL_REWRITE_HEADER = "x-llm-d-router-model-name-rewrite"
"""The model the upstream gets in the body instead of the client's."""
SLO_TTFT_HEADER = "x-llm-d-router-slo-ttft-ms"
"""The request's time-to-first-token SLO in milliseconds (``slo-deadline-ordering-policy``,
``predicted-latency-producer``)."""
SLO_TPOT_HEADER = "x-llm-d-router-slo-tpot-ms"
"""The request's time-per-output-token SLO in milliseconds (``predicted-latency-producer``)."""
DESTINATION_HEADER = "x-llm-d-router-destination-endpoint"
"""The picked ``ip:port`` (comma-separated fallbacks after it): request header and ``envoy.lb`` key EPP writes."""
SERVED_HEADER = "x-llm-d-router-destination-endpoint-served"
"""The ``envoy.lb`` key where a gateway reports the endpoint that actually served the request."""
SUBSET_HEADER = "x-llm-d-router-destination-endpoint-subset"
"""The ``envoy.lb.subset_hint`` key listing the endpoints the gateway allows EPP to pick from."""
DROPPED_REASON_HEADER = "x-llm-d-router-request-dropped-reason"
"""Response header: why EPP dropped a request before any model server saw it (:mod:`epp.errors`)."""

HEADER_ALIASES: Final[Mapping[str, str]] = MappingProxyType({
    FAIRNESS_ID_HEADER: "x-gateway-inference-fairness-id",
    OBJECTIVE_HEADER: "x-gateway-inference-objective",
    MODEL_REWRITE_HEADER: "x-gateway-model-name-rewrite",
    SLO_TTFT_HEADER: "x-slo-ttft-ms",
    SLO_TPOT_HEADER: "x-slo-tpot-ms",
    DESTINATION_HEADER: "x-gateway-destination-endpoint",
    SERVED_HEADER: "x-gateway-destination-endpoint-served",
    SUBSET_HEADER: "x-gateway-destination-endpoint-subset",
    DROPPED_REASON_HEADER: "x-llm-d-request-dropped-reason",
})
"""Current name -> its deprecated alias (the Gateway API Inference Extension's name; for the drop reason, llm-d's
earlier one), read-only."""


def header_names(name: str) -> tuple[str, ...]:
    """``name`` followed by its deprecated alias, or ``(name,)`` when it has none (the reference's
    ``HeaderNames``)."""
    alias = HEADER_ALIASES.get(name)
    return (name,) if alias is None else (name, alias)


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    """The value of the current header ``name`` in a lower-case header map, else of its deprecated alias, else
    None. A present current name wins even when empty."""
    value = headers.get(name)
    if value is None and name in HEADER_ALIASES:  # `in` and `[]`: MappingProxyType.get() costs a method call
        return headers.get(HEADER_ALIASES[name])
    return value
