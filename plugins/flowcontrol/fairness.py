"""Fairness policies for flow-control bands (``fairnessPolicyRef``): which flow (tenant) of a band goes next.

Only *ready* flows compete: non-empty, with a tenant whose ``maxConcurrent``/``maxTokensInFlight`` admit the head.

- ``global-strict-fairness-policy`` (default): no fairness; the band is one queue in ordering-policy order.
- ``round-robin-fairness-policy``: one request per ready flow in turn.
- ``weighted-fair-fairness-policy``: deficit round robin by tenant ``weight`` (from the ``tenants`` table): with
  every tenant backlogged, dispatches follow the weights; every ready tenant is served at least once per round.

Each band gets its own selector (cursor, deficits), so one plugin instance may serve several bands.

YAML::

    plugins:
    - type: weighted-fair-fairness-policy
    flowControl:
      priorityBands:
      - {priority: 0, fairnessPolicyRef: weighted-fair-fairness-policy}
      tenants:
        flood: {weight: 1}
        steady: {weight: 2}
"""

from __future__ import annotations

from typing import ClassVar

from epp.flowcontrol.policies import (
    FairnessPolicy,
    FlowSelector,
    GlobalStrictSelector,
    RoundRobinSelector,
    WeightedFairSelector,
)
from epp.framework.plugins import Handle, NoParams

__all__ = ["GlobalStrictFairnessPolicy", "RoundRobinFairnessPolicy", "WeightedFairFairnessPolicy"]


class _FairnessPlugin:
    type_name: ClassVar[str]
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params


class GlobalStrictFairnessPolicy(_FairnessPlugin):
    """The flow whose head request sorts first (by the band's ordering policy) goes next."""

    type_name: ClassVar[str] = "global-strict-fairness-policy"

    def new_selector(self) -> FlowSelector:
        """A selector for one band."""
        return GlobalStrictSelector()


class RoundRobinFairnessPolicy(_FairnessPlugin):
    """Ready flows take turns, one request each."""

    type_name: ClassVar[str] = "round-robin-fairness-policy"

    def new_selector(self) -> FlowSelector:
        """A selector for one band."""
        return RoundRobinSelector()


class WeightedFairFairnessPolicy(_FairnessPlugin):
    """Deficit round robin by tenant weight."""

    type_name: ClassVar[str] = "weighted-fair-fairness-policy"

    def new_selector(self) -> FlowSelector:
        """A selector for one band."""
        return WeightedFairSelector()


_check_strict: type[FairnessPolicy] = GlobalStrictFairnessPolicy
_check_rr: type[FairnessPolicy] = RoundRobinFairnessPolicy
_check_wf: type[FairnessPolicy] = WeightedFairFairnessPolicy
