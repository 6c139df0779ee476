"""The request headers EPP acts on or forwards, who may set each, and their deprecated aliases: one table for both
front ends.

:data:`HEADER_RULES` gives each header's use, its :class:`Trust` and whether its value reaches the model server:
client-settable headers are read from any request; trusted-only ones (routing, rewriting) are removed from every
request before EPP reads it unless the operator trusts the downstream with them (``--trusted-headers``); EPP-only
ones are EPP's own output. :class:`HeaderTrust` applies the table with O(untrusted names) dict lookups per request.
:data:`HEADER_ALIASES` maps current llm-d-router names to their Gateway API Inference Extension aliases: the current
name is read first, the alias only when it is absent; EPP writes both names of what it emits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from epp.errors import DROPPED_REASON_ALIAS, DROPPED_REASON_HEADER, ConfigError

__all__ = [
    "FAIRNESS_ID_HEADER", "OBJECTIVE_HEADER", "MODEL_REWRITE_HEADER", "SLO_TTFT_HEADER", "SLO_TPOT_HEADER",
    "DESTINATION_HEADER", "SERVED_HEADER", "SUBSET_HEADER", "DROPPED_REASON_HEADER", "SESSION_HEADER",
    "REQUEST_ID_HEADER", "PREFILLER_HEADER", "ENCODER_HEADER", "DATA_PARALLEL_HEADER", "HEADER_ALIASES",
    "Trust", "HeaderRule", "HEADER_RULES", "HeaderTrust", "parse_trusted_headers", "header_names", "header_value",
    "PRIMARY_KEY", "SCORES_KEY",
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
# DROPPED_REASON_HEADER (imported above) is defined by epp.errors, which sends it and cannot import this module.
SESSION_HEADER = "x-session-token"
"""The session-affinity plugins' default session header."""
REQUEST_ID_HEADER = "x-request-id"
"""Names the request in logs and plugin state; EPP makes one up when a request has none."""
PREFILLER_HEADER = "x-prefiller-host-port"
"""The prefill endpoint, for llm-d's routing sidecar on the decode pod."""
ENCODER_HEADER = "x-encoder-hosts-ports"
"""The encode endpoints (comma-separated), for llm-d's routing sidecar."""
DATA_PARALLEL_HEADER = "x-data-parallel-host-port"
"""The data-parallel rank the model server's sidecar forwards the request to."""

HEADER_ALIASES: Final[Mapping[str, str]] = MappingProxyType({
    FAIRNESS_ID_HEADER: "x-gateway-inference-fairness-id",
    OBJECTIVE_HEADER: "x-gateway-inference-objective",
    MODEL_REWRITE_HEADER: "x-gateway-model-name-rewrite",
    SLO_TTFT_HEADER: "x-slo-ttft-ms",
    SLO_TPOT_HEADER: "x-slo-tpot-ms",
    DESTINATION_HEADER: "x-gateway-destination-endpoint",
    SERVED_HEADER: "x-gateway-destination-endpoint-served",
    SUBSET_HEADER: "x-gateway-destination-endpoint-subset",
    DROPPED_REASON_HEADER: DROPPED_REASON_ALIAS,
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


class Trust(StrEnum):
    """Who may set a request header."""

    CLIENT = "client-settable"
    """Read from any request (EPP has no client authentication: whoever reaches it may set these)."""
    TRUSTED = "trusted-only"
    """Removed from requests unless ``--trusted-headers`` names it (the downstream sets or strips it)."""
    EPP = "epp-only"
    """EPP's own output: a request's copy is always removed, or overwritten by EPP's value."""


@dataclass(frozen=True, slots=True)
class HeaderRule:
    """One row of :data:`HEADER_RULES`. ``forwarded``: whether a request's value (when trust lets it in) reaches
    the model server; EPP's own values of a header are set regardless."""

    name: str
    trust: Trust
    forwarded: bool
    use: str

    @property
    def names(self) -> tuple[str, ...]:
        """The current name, then its deprecated alias if it has one."""
        return header_names(self.name)


HEADER_RULES: Final[tuple[HeaderRule, ...]] = (
    HeaderRule(FAIRNESS_ID_HEADER, Trust.CLIENT, False, "flow-control tenant; the fairness_id metric label"),
    HeaderRule(OBJECTIVE_HEADER, Trust.CLIENT, False, "names the InferenceObjective: the request's priority"),
    HeaderRule(SLO_TTFT_HEADER, Trust.CLIENT, True, "TTFT SLO in ms (SLO ordering, latency prediction)"),
    HeaderRule(SLO_TPOT_HEADER, Trust.CLIENT, True, "TPOT SLO in ms (latency prediction)"),
    HeaderRule(SESSION_HEADER, Trust.CLIENT, True, "session affinity (the plugins' default header)"),
    HeaderRule(REQUEST_ID_HEADER, Trust.CLIENT, True, "names the request; EPP makes one up when absent"),
    HeaderRule(MODEL_REWRITE_HEADER, Trust.TRUSTED, False, "the model the upstream body names instead of the "
               "client's (an InferenceModelRewrite rule wins)"),
    HeaderRule(SUBSET_HEADER, Trust.TRUSTED, False, "restricts the candidates (comma-separated ip[:port]); "
               "through Envoy the envoy.lb.subset_hint metadata wins"),
    HeaderRule(DATA_PARALLEL_HEADER, Trust.TRUSTED, True, "data-parallel rank for the model server's sidecar; "
               "EPP's own value wins"),
    HeaderRule(ENCODER_HEADER, Trust.TRUSTED, True, "encode endpoints for the sidecar; EPP's own value wins"),
    HeaderRule(PREFILLER_HEADER, Trust.TRUSTED, True, "prefill endpoint for the sidecar; EPP's own value wins"),
    HeaderRule(DESTINATION_HEADER, Trust.EPP, False, "the picked endpoint(s): EPP writes it"),
    HeaderRule(SERVED_HEADER, Trust.EPP, False, "EPP reads the served endpoint from Envoy's envoy.lb metadata "
               "only"),
)
"""Every request header EPP acts on or forwards. Headers not listed pass through to the model server untouched
(hop-by-hop and framing headers aside)."""

_BY_NAME: Final[Mapping[str, HeaderRule]] = MappingProxyType(
    {name: rule for rule in HEADER_RULES for name in rule.names})


class HeaderTrust:
    """The table applied with the operator's trusted headers (``--trusted-headers``); one per server, shared by
    both front ends through the Director.

    ``stripped``: the names (aliases included) removed from every request; ``consumed``: names EPP reads but never
    forwards; ``trusts_subset``: whether a request's subset header restricts the candidates.
    """

    __slots__ = ("trusted", "stripped", "consumed", "trusts_subset")

    def __init__(self, trusted: Iterable[str] = ()) -> None:
        rules = {_trustable(name) for name in trusted}
        self.trusted: frozenset[str] = frozenset(rule.name for rule in rules)
        kept = [r for r in HEADER_RULES if r.trust is Trust.CLIENT or r in rules]
        self.stripped: tuple[str, ...] = tuple(n for r in HEADER_RULES if r not in kept for n in r.names)
        self.consumed: tuple[str, ...] = tuple(n for r in kept if not r.forwarded for n in r.names)
        self.trusts_subset = SUBSET_HEADER in self.trusted

    def strip(self, headers: dict[str, str]) -> list[str]:
        """Remove the untrusted headers from ``headers`` (lower-case names; changed in place) and return the
        names to remove from the upstream request: those removed here and the consumed ones present."""
        out = []
        for name in self.stripped:
            if name in headers:
                del headers[name]
                out.append(name)
        for name in self.consumed:
            if name in headers:
                out.append(name)
        return out

    def subset(self, headers: Mapping[str, str]) -> list[str] | None:
        """The subset hint a trusted downstream put in the subset header (comma-separated ``ip[:port]``; empty:
        no endpoint allowed), or None when absent or not trusted."""
        if not self.trusts_subset:
            return None
        value = header_value(headers, SUBSET_HEADER)
        if value is None:
            return None
        return [item.strip() for item in value.split(",") if item.strip()]

    def __repr__(self) -> str:
        return f"HeaderTrust(trusted={sorted(self.trusted)!r})"


def parse_trusted_headers(text: str) -> tuple[str, ...]:
    """The canonical names in a comma-separated ``--trusted-headers`` value (current names or aliases, any case);
    :class:`~epp.errors.ConfigError` naming a header that is not trusted-only."""
    return tuple(dict.fromkeys(_trustable(item).name for item in text.split(",") if item.strip()))


def _trustable(name: str) -> HeaderRule:
    key = name.strip().lower()
    rule = _BY_NAME.get(key)
    if rule is None or rule.trust is not Trust.TRUSTED:
        choices = ", ".join(r.name for r in HEADER_RULES if r.trust is Trust.TRUSTED)
        why = ("is not a header EPP acts on" if rule is None else "is client-settable: every request may set it"
               if rule.trust is Trust.CLIENT else "is EPP's own output and never taken from a request")
        raise ConfigError(f"--trusted-headers: {key!r} {why}; trusted-only headers: {choices}",
                          field="--trusted-headers")
    return rule


# ``envoy.lb`` metadata keys EPP writes that have no request header of the same name (and no alias).
PRIMARY_KEY = "x-gateway-destination-endpoint-primary"
"""EPP's own ``envoy.lb`` key holding only the target: Envoy's ORIGINAL_DST cluster cannot parse the comma-separated
fallback list under the destination keys. Not renamed: the reference has no such key, and the Envoy config
``epp envoy-config`` writes routes on it."""
SCORES_KEY = "x-gateway-destination-endpoint-scores"
"""The ``envoy.lb`` key under which ``--emit-endpoint-scores`` puts every scored candidate's score (the reference's
name; it has no ``x-llm-d-router-`` spelling)."""
