"""The ``flowControl`` config section: the reference's schema plus this project's tenant table.

Reference fields: ``maxBytes``/``maxRequests`` (global queue capacity; Kubernetes quantities, unlimited when 0),
``defaultRequestTTL`` and ``noEndpointRequestTTL`` (queue-wait budgets, default 60s), ``defaultPriorityBand`` and
``defaultNegativePriorityBand`` (templates for unlisted priorities), ``priorityBands``,
``usageLimitPolicyPluginRef``, ``saturationDetector`` (``{pluginRef}``) and ``enableEviction`` (not implemented:
``true`` is a ConfigError with the gate on). This project adds ``tenants`` (per fairness id quotas; ``defaults`` is
the template every tenant inherits from), ``objectives`` (objective name -> priority) and ``dispatchInterval``.

.. code-block:: yaml

    featureGates: [flowControl]
    flowControl:
      maxRequests: 5000
      defaultRequestTTL: 30s
      priorityBands:
      - priority: 0
        maxBytes: 512Mi
        fairnessPolicyRef: weighted-fair-fairness-policy
      tenants:
        defaults: {weight: 1, maxConcurrent: 16, maxQueued: 200}
        steady: {weight: 2, maxConcurrent: 64, maxTokensInFlight: 400000}
        batch: {rate: {requestsPerSecond: 5, burst: 10}}
      objectives: {interactive: 10, batch: -1}
"""

from __future__ import annotations

from typing import Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from epp.config.units import Duration, Quantity, parse_duration, parse_quantity
from epp.framework.request import InferenceRequest

__all__ = [
    "FlowControlConfig", "PriorityBandConfig", "TenantConfig", "RateConfig", "Duration", "ByteSize", "Quantity",
    "parse_duration", "parse_byte_size", "parse_quantity", "resolve_priority", "DEFAULT_BAND_MAX_BYTES",
    "DEFAULT_BAND_MAX_REQUESTS", "DEFAULT_REQUEST_TTL",
    "DEFAULT_TENANT_KEY", "DEFAULT_FAIRNESS_POLICY", "DEFAULT_ORDERING_POLICY", "DEFAULT_USAGE_LIMIT_POLICY",
    "SaturationDetectorRef",
]

DEFAULT_BAND_MAX_BYTES = 1_000_000_000  # the reference's per-band default (1 GB)
DEFAULT_BAND_MAX_REQUESTS = 5000  # the reference's per-band default request capacity
DEFAULT_REQUEST_TTL = 60.0  # the reference's defaultRequestTTL and noEndpointRequestTTL when omitted (seconds)
DEFAULT_TENANT_KEY = "defaults"
DEFAULT_FAIRNESS_POLICY = "global-strict-fairness-policy"
DEFAULT_ORDERING_POLICY = "fcfs-ordering-policy"
DEFAULT_USAGE_LIMIT_POLICY = "static-usage-limit-policy"

ByteSize = Quantity
"""Bytes, written in YAML as a number or a Kubernetes quantity."""

parse_byte_size = parse_quantity
"""Bytes from a Kubernetes quantity (the name the byte-size fields used first)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class PriorityBandConfig(_Model):
    """One priority band: queue capacity and the policies that pick a flow and a request.

    ``maxBytes`` defaults to 1 GB and ``maxRequests`` to 5000, and 0 means the default too (as the reference: a
    band's limits are always bounded; set a large value to lift one). The policy refs name a plugin declared in
    ``plugins:``; only the defaults (``global-strict-fairness-policy``, ``fcfs-ordering-policy``) need no declaration.
    """

    priority: int = 0
    max_bytes: ByteSize | None = Field(None, alias="maxBytes")
    max_requests: Quantity | None = Field(None, alias="maxRequests")
    fairness_policy_ref: str = Field(DEFAULT_FAIRNESS_POLICY, alias="fairnessPolicyRef", min_length=1)
    ordering_policy_ref: str = Field(DEFAULT_ORDERING_POLICY, alias="orderingPolicyRef", min_length=1)

    @property
    def byte_limit(self) -> int:
        """The effective byte capacity: ``maxBytes``, or 1 GB when it is unset or 0."""
        return self.max_bytes or DEFAULT_BAND_MAX_BYTES

    @property
    def request_limit(self) -> int:
        """The effective request capacity: ``maxRequests``, or 5000 when it is unset or 0."""
        return self.max_requests or DEFAULT_BAND_MAX_REQUESTS


class RateConfig(_Model):
    """A token bucket: ``requestsPerSecond`` refill rate and ``burst`` size (default: max(1, rate))."""

    requests_per_second: float = Field(alias="requestsPerSecond", gt=0)
    burst: float | None = Field(None, ge=1)

    @property
    def capacity(self) -> float:
        """The bucket size."""
        return self.burst if self.burst is not None else max(1.0, self.requests_per_second)


class TenantConfig(_Model):
    """One tenant's quota. Unset limits are unlimited.

    ``maxConcurrent`` and ``maxTokensInFlight`` bound what the tenant has in flight to model servers (a request over
    them waits in its flow); ``rate`` and ``maxQueued`` are checked on arrival (over them: 429). ``requestTTL``
    overrides ``defaultRequestTTL`` for this tenant's requests (and so their EDF deadlines).
    """

    weight: float = Field(1.0, gt=0)
    max_concurrent: int | None = Field(None, alias="maxConcurrent", ge=1)
    max_tokens_in_flight: int | None = Field(None, alias="maxTokensInFlight", ge=1)
    rate: RateConfig | None = None
    max_queued: int | None = Field(None, alias="maxQueued", ge=1)
    request_ttl: Duration | None = Field(None, alias="requestTTL")

    def over(self, base: TenantConfig) -> TenantConfig:
        """This entry with every field it did not set taken from ``base`` (the ``defaults`` entry)."""
        explicit = {name: getattr(self, name) for name in self.model_fields_set}
        return base.model_copy(update=explicit)


class SaturationDetectorRef(_Model):
    """``flowControl.saturationDetector``: the detector plugin to use; an empty ``pluginRef`` means the default."""

    plugin_ref: str = Field("", alias="pluginRef")


class FlowControlConfig(_Model):
    """The ``flowControl`` section (see the module docstring for the YAML)."""

    max_bytes: ByteSize | None = Field(None, alias="maxBytes")
    max_requests: Quantity | None = Field(None, alias="maxRequests")
    default_request_ttl: Duration = Field(DEFAULT_REQUEST_TTL, alias="defaultRequestTTL")
    """Queue-wait budget while the candidate pool has endpoints (0: none); a tenant's ``requestTTL`` overrides it."""
    no_endpoint_request_ttl: Duration = Field(DEFAULT_REQUEST_TTL, alias="noEndpointRequestTTL")
    """Queue-wait budget while the candidate pool has no endpoints (0: none)."""
    default_priority_band: PriorityBandConfig | None = Field(None, alias="defaultPriorityBand")
    default_negative_priority_band: PriorityBandConfig | None = Field(None, alias="defaultNegativePriorityBand")
    priority_bands: list[PriorityBandConfig] = Field(default_factory=list, alias="priorityBands")
    usage_limit_policy_plugin_ref: str = Field(DEFAULT_USAGE_LIMIT_POLICY, alias="usageLimitPolicyPluginRef",
                                               min_length=1)
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)
    objectives: dict[str, int] = Field(default_factory=dict)
    dispatch_interval: Duration = Field(0.05, alias="dispatchInterval", gt=0)
    saturation_detector: SaturationDetectorRef | None = Field(None, alias="saturationDetector")
    enable_eviction: bool = Field(False, alias="enableEviction")
    """The reference's demand-driven in-flight eviction; EPP has none, so with the gate on ``true`` is refused
    when the config is loaded (:func:`epp.flowcontrol.build.load_flow_control`)."""

    @model_validator(mode="after")
    def _unique_band_priorities(self) -> FlowControlConfig:
        seen: set[int] = set()
        for band in self.priority_bands:
            if band.priority in seen:
                raise ValueError(f"priorityBands: priority {band.priority} is configured twice")
            seen.add(band.priority)
        return self

    @property
    def default_tenant(self) -> TenantConfig:
        """The template for fairness ids not in the tenant table."""
        return self.tenants.get(DEFAULT_TENANT_KEY) or TenantConfig()

    def tenant(self, fairness_id: str) -> tuple[TenantConfig, bool]:
        """The effective quota of ``fairness_id`` and whether it is a registered (listed) tenant."""
        entry = self.tenants.get(fairness_id)
        if entry is None or fairness_id == DEFAULT_TENANT_KEY:
            return self.default_tenant, False
        return entry.over(self.default_tenant), True

    def band(self, priority: int) -> PriorityBandConfig:
        """The band config for ``priority``: the listed one, else the ``defaultNegativePriorityBand`` template for a
        priority below 0 (when set), else the ``defaultPriorityBand`` template."""
        for band in self.priority_bands:
            if band.priority == priority:
                return band
        template = self.default_priority_band or PriorityBandConfig()
        if priority < 0 and self.default_negative_priority_band is not None:
            template = self.default_negative_priority_band
        return template.model_copy(update={"priority": priority})

    def priority_for(self, objective: str | None) -> int:
        """The priority of an objective name (0 when unknown or None, as the reference)."""
        return self.objectives.get(objective, 0) if objective is not None else 0


def resolve_priority(request: InferenceRequest, objectives: Mapping[str, int]) -> int:
    """The priority ``request`` should have: its objective's, else the priority it already carries."""
    if request.objective is not None and request.objective in objectives:
        return objectives[request.objective]
    return request.priority
