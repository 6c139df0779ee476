"""``static-usage-limit-policy``: the saturation at which a priority band stops dispatching.

Each dispatch cycle visits bands from the highest priority down; when the pool saturation is at or above the band's
limit the cycle stops (head-of-line blocking, as the reference). ``threshold`` (default 1.0) applies to every
priority; ``priorityThresholds`` overrides it per priority, e.g. to stop sheddable traffic earlier and keep
headroom for interactive traffic.

YAML::

    plugins:
    - type: static-usage-limit-policy
      parameters: {threshold: 1.0, priorityThresholds: {"-1": 0.8}}
    flowControl:
      usageLimitPolicyPluginRef: static-usage-limit-policy
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from epp.flowcontrol.policies import StaticUsageLimit, UsageLimitPolicy
from epp.framework.plugins import Handle
from epp.framework.plugins import Params as PluginParams

__all__ = ["StaticUsageLimitPolicy"]


class StaticUsageLimitPolicy(StaticUsageLimit):
    """A fixed saturation ceiling, optionally per priority."""

    type_name: ClassVar[str] = "static-usage-limit-policy"

    class Params(PluginParams):
        threshold: float = Field(1.0, gt=0)
        priority_thresholds: dict[int, float] = Field(default_factory=dict, alias="priorityThresholds")

    def __init__(self, name: str, params: Params, handle: Handle | None = None) -> None:
        super().__init__(params.threshold, params.priority_thresholds)
        self.name = name
        self.params = params


_check: type[UsageLimitPolicy] = StaticUsageLimitPolicy
