"""Composition: :func:`build_admission` turns the config into the request path's admission controller.

Flow control is on when ``flowControl`` is among the feature gates (the ``flowControl`` section then configures
it; without one the reference defaults apply). Otherwise admission is :class:`~.legacy.LegacyAdmission`.

Policy refs (``fairnessPolicyRef``, ``orderingPolicyRef``, ``usageLimitPolicyPluginRef``) name a plugin instance
from ``plugins:`` (looked up in ``handle``) or, failing that, a built-in policy type; anything else is a
:class:`~epp.errors.ConfigError` at start-up, so a dynamically created band can never name a missing policy.
"""

from __future__ import annotations

import time
from typing import Callable, Collection, Mapping, Sequence, TypeVar

from prometheus_client import CollectorRegistry

from ..endpoint import Endpoint
from ..errors import ConfigError
from ..framework import Handle, SaturationDetector
from .base import FLOW_CONTROL_GATE, AdmissionController
from .config import DEFAULT_USAGE_LIMIT_POLICY, FlowControlConfig, PriorityBandConfig
from .controller import FlowController, Policies
from .legacy import LegacyAdmission
from .metrics import FlowControlMetrics
from .policies import (BUILTIN_FAIRNESS, BUILTIN_ORDERING, FairnessPolicy, OrderingPolicy, StaticUsageLimit,
                       UsageLimitPolicy)

__all__ = ["build_admission", "resolve_policies"]

_P = TypeVar("_P")


def build_admission(config: FlowControlConfig | None, feature_gates: Collection[str], detector: SaturationDetector,
                    metrics_registry: CollectorRegistry | None, clock: Callable[[], float] = time.monotonic, *,
                    handle: Handle | None = None, pool_name: str = "", policies: Policies | None = None,
                    pool: Callable[[], Sequence[Endpoint]] | None = None) -> AdmissionController:
    """The admission controller for a config: a :class:`FlowController` or :class:`LegacyAdmission`.

    ``metrics_registry`` receives the ``inference_extension_flow_control_*`` collectors (None: unregistered);
    ``clock`` (monotonic seconds) is injectable for tests; ``handle`` resolves policy refs to configured plugins;
    ``pool_name`` fills the ``inference_pool`` label; ``policies`` are the config's refs already resolved (the
    config loader resolves them, see :attr:`epp.config.Pipeline.flow_policies`), else they are resolved here;
    ``pool`` (every endpoint of the pool) keeps the ``pool_saturation`` gauge current, computed at each collection.
    Call ``await controller.start()`` before serving.
    """
    metrics = FlowControlMetrics(metrics_registry, pool_name)
    if FLOW_CONTROL_GATE not in feature_gates:
        return LegacyAdmission(detector, metrics)
    config = config if config is not None else FlowControlConfig()
    return FlowController(config, detector, policies or resolve_policies(config, handle), metrics, clock, pool)


def resolve_policies(config: FlowControlConfig, handle: Handle | None = None) -> Policies:
    """Resolve every policy ref in ``config`` (listed bands and the default-band template)."""
    bands = [*config.priority_bands, config.default_priority_band or PriorityBandConfig()]
    fairness = {b.fairness_policy_ref: _lookup(b.fairness_policy_ref, "fairnessPolicyRef", "fairness policy",
                                               FairnessPolicy, BUILTIN_FAIRNESS, handle) for b in bands}
    ordering = {b.ordering_policy_ref: _lookup(b.ordering_policy_ref, "orderingPolicyRef", "ordering policy",
                                               OrderingPolicy, BUILTIN_ORDERING, handle) for b in bands}
    usage_builtins: Mapping[str, UsageLimitPolicy] = {DEFAULT_USAGE_LIMIT_POLICY: StaticUsageLimit()}
    usage = _lookup(config.usage_limit_policy_plugin_ref, "usageLimitPolicyPluginRef", "usage limit policy",
                    UsageLimitPolicy, usage_builtins, handle)
    return Policies(fairness, ordering, usage)


def _lookup(ref: str, field: str, kind: str, protocol: type[_P], builtins: Mapping[str, _P],
            handle: Handle | None) -> _P:
    plugin = handle.plugin(ref) if handle is not None else None
    if plugin is not None:
        if not isinstance(plugin, protocol):
            raise ConfigError(f"flowControl.{field}: plugin '{ref}' (type: {plugin.type_name}) is not a {kind}",
                              plugin=ref, field=field)
        return plugin
    found = builtins.get(ref)
    if found is None:
        known = ", ".join(sorted(builtins))
        raise ConfigError(f"flowControl.{field}: '{ref}' is neither a configured plugin nor a built-in {kind} "
                          f"(built-in: {known})", plugin=ref, field=field)
    return found
