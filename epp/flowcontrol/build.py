"""Composition: :func:`build_admission` turns the config into the request path's admission controller.

Flow control is on when ``flowControl`` is among the feature gates (the ``flowControl`` section then configures
it; without one the reference defaults apply). Otherwise admission is :class:`~.legacy.LegacyAdmission`.

Policy refs (``fairnessPolicyRef``, ``orderingPolicyRef``, ``usageLimitPolicyPluginRef``) name a plugin instance
declared in ``plugins:`` (looked up in ``handle``). As in the reference (its loader's ``ensureFlowControlLayer``),
only the defaults are there implicitly: ``global-strict-fairness-policy``, ``fcfs-ordering-policy`` and
``static-usage-limit-policy``; any other ref that names no declared plugin is a :class:`~epp.errors.ConfigError`
at start-up (the reference: "no fairness policy registered for name"), so a dynamically created band can never
name a missing policy. Without a handle (programmatic use: tests, benchmarks) a ref may name any built-in policy
type of :mod:`.policies`.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Collection, Mapping, Sequence, TypeVar

import orjson
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from epp.errors import ConfigError
from epp.flowcontrol.base import FLOW_CONTROL_GATE, AdmissionController
from epp.flowcontrol.config import (
    DEFAULT_FAIRNESS_POLICY,
    DEFAULT_ORDERING_POLICY,
    DEFAULT_USAGE_LIMIT_POLICY,
    FlowControlConfig,
    PriorityBandConfig,
)
from epp.flowcontrol.controller import FlowController, Policies
from epp.flowcontrol.legacy import LegacyAdmission
from epp.flowcontrol.metrics import FlowControlMetrics
from epp.flowcontrol.policies import (
    BUILTIN_FAIRNESS,
    BUILTIN_ORDERING,
    FairnessPolicy,
    OrderingPolicy,
    StaticUsageLimit,
    UsageLimitPolicy,
)
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import Handle, SaturationDetector
from epp.framework.registry import drop_null_fields, format_validation_error
from epp.metrics.instruments import LabelCap
from epp.metrics.labels import RequestLabels

__all__ = ["build_admission", "resolve_policies", "policy_ref_path", "load_flow_control", "register_policy_metrics"]

_P = TypeVar("_P")


def build_admission(config: FlowControlConfig | None, feature_gates: Collection[str], detector: SaturationDetector,
                    metrics_registry: CollectorRegistry | None, clock: Callable[[], float] = time.monotonic, *,
                    handle: Handle | None = None, pool_name: str = "", policies: Policies | None = None,
                    pool: Callable[[], Sequence[Endpoint]] | None = None,
                    fairness_ids: LabelCap | None = None, labels: RequestLabels | None = None
                    ) -> AdmissionController:
    """The admission controller for a config: a :class:`FlowController` or :class:`LegacyAdmission`.

    ``metrics_registry`` receives the ``inference_extension_flow_control_*`` collectors (None: unregistered);
    ``clock`` (monotonic seconds) is injectable for tests; ``handle`` resolves policy refs to configured plugins;
    ``pool_name`` fills the ``inference_pool`` label; ``policies`` are the config's refs already resolved (the
    config loader resolves them, see :attr:`epp.config.loader.Pipeline.flow_policies`), else they are resolved here;
    ``pool`` (every endpoint of the pool) keeps the ``pool_saturation`` gauge current, computed at each collection;
    ``fairness_ids`` bounds the ``fairness_id`` label, ``labels`` that and the model labels (shared with the
    request metrics; default: bounds of their own).
    Call ``await controller.start()`` before serving.
    """
    metrics = FlowControlMetrics(metrics_registry, pool_name, fairness_ids, labels)
    if FLOW_CONTROL_GATE not in feature_gates:
        return LegacyAdmission(detector, metrics)
    config = config if config is not None else FlowControlConfig()
    policies = policies or resolve_policies(config, handle)
    if metrics_registry is not None:
        register_policy_metrics(policies, metrics_registry)
    return FlowController(config, detector, policies, metrics, clock, pool)


def register_policy_metrics(policies: Policies, registry: CollectorRegistry) -> None:
    """Register the metrics of the fairness policies the config's bands use: a policy class that defines
    ``metrics_collector(instances) -> Collector`` (a classmethod) gets one collector over its distinct instances
    (as the reference's policies register their collectors on the framework's registry at construction; here
    only a policy flow control actually uses exports)."""
    by_class: dict[type, tuple[Callable[[list[Any]], Any], list[Any]]] = {}  # class -> (its factory, instances)
    for policy in policies.fairness.values():
        factory = getattr(type(policy), "metrics_collector", None)
        if callable(factory):
            _, instances = by_class.setdefault(type(policy), (factory, []))
            if all(p is not policy for p in instances):
                instances.append(policy)
    for factory, instances in by_class.values():
        registry.register(factory(instances))


def resolve_policies(config: FlowControlConfig, handle: Handle | None = None) -> Policies:
    """Resolve every policy ref in ``config`` (listed bands and the default-band template); see the module
    docstring for what a ref may name with and without ``handle``."""
    bands = [*config.priority_bands, config.default_priority_band or PriorityBandConfig()]
    if config.default_negative_priority_band is not None:
        bands.append(config.default_negative_priority_band)
    fairness_builtins = _implicit(BUILTIN_FAIRNESS, DEFAULT_FAIRNESS_POLICY, handle)
    ordering_builtins = _implicit(BUILTIN_ORDERING, DEFAULT_ORDERING_POLICY, handle)
    fairness = {b.fairness_policy_ref: _lookup(b.fairness_policy_ref, "fairnessPolicyRef", "fairness policy",
                                               FairnessPolicy, fairness_builtins, handle) for b in bands}
    ordering = {b.ordering_policy_ref: _lookup(b.ordering_policy_ref, "orderingPolicyRef", "ordering policy",
                                               OrderingPolicy, ordering_builtins, handle) for b in bands}
    usage_builtins: Mapping[str, UsageLimitPolicy] = {DEFAULT_USAGE_LIMIT_POLICY: StaticUsageLimit()}
    usage = _lookup(config.usage_limit_policy_plugin_ref, "usageLimitPolicyPluginRef", "usage limit policy",
                    UsageLimitPolicy, usage_builtins, handle)
    return Policies(fairness, ordering, usage)


def policy_ref_path(raw: Mapping[str, Any], fld: str, ref: str | None) -> tuple[str | int, ...]:
    """The YAML path of the ``flowControl`` policy ref ``fld`` that names ``ref`` (the section if not found)."""
    bands = raw.get("priorityBands")
    for i, band in enumerate(bands if isinstance(bands, list) else []):
        if isinstance(band, dict) and band.get(fld) == ref:
            return ("flowControl", "priorityBands", i, fld)
    for key in ("defaultPriorityBand", "defaultNegativePriorityBand"):
        default = raw.get(key)
        if isinstance(default, dict) and default.get(fld) == ref:
            return ("flowControl", key, fld)
    return ("flowControl", fld)


def _implicit(builtins: Mapping[str, _P], default: str, handle: Handle | None) -> Mapping[str, _P]:
    """The built-ins a ref may name without declaring them: only the default when loading a config (``handle``),
    every built-in type in programmatic use."""
    return builtins if handle is None else {default: builtins[default]}


def _lookup(ref: str, field: str, kind: str, protocol: type[Any], builtins: Mapping[str, _P],
            handle: Handle | None) -> _P:
    # ``protocol`` is the (runtime-checkable) Protocol a plugin must satisfy: a Protocol is no concrete type[_P]
    plugin = handle.plugin(ref) if handle is not None else None
    if plugin is not None:
        if not isinstance(plugin, protocol):
            raise ConfigError(f"flowControl.{field}: plugin '{ref}' (type: {plugin.type_name}) is not a {kind}",
                              plugin=ref, field=field)
        return plugin
    found = builtins.get(ref)
    if found is None:
        known = ", ".join(sorted(builtins))
        raise ConfigError(f"flowControl.{field}: no {kind} registered for name '{ref}'; declare it under plugins: "
                          f"(available without declaring: {known})", plugin=ref, field=field)
    return found


def load_flow_control(raw: dict[str, Any] | None, feature_gates: Collection[str], handle: Handle,
                      error: Callable[..., ConfigError]) -> tuple[FlowControlConfig | None, Any]:
    """The config's ``flowControl`` section validated (None when absent), and, with the flowControl gate on, its
    policy refs resolved (else None); ``enableEviction: true`` with the gate on is refused (EPP has no eviction). ``error(msg, *yaml_path, plugin=, fld=)`` builds the config error, with the
    line of ``yaml_path``."""
    try:
        config = FlowControlConfig.model_validate_json(
            orjson.dumps(drop_null_fields(raw or {}, FlowControlConfig)), strict=True)
    except ValidationError as exc:
        fld, msg = format_validation_error(exc, "field")
        loc = tuple(exc.errors()[0].get("loc", ()))
        raise error(f"flowControl: field {msg}", "flowControl", *loc, fld=fld) from exc
    policies = None
    if FLOW_CONTROL_GATE in feature_gates and config.enable_eviction:
        raise error("flowControl.enableEviction: EPP does not terminate in-flight requests to make room for "
                    "higher-priority ones (the reference's experimental demand-driven eviction); remove the field "
                    "or set it to false", "flowControl", "enableEviction", fld="flowControl.enableEviction")
    if FLOW_CONTROL_GATE in feature_gates:
        try:
            policies = resolve_policies(config, handle)
        except ConfigError as exc:
            path = policy_ref_path(raw or {}, exc.field or "", exc.plugin)
            raise error(str(exc), *path, plugin=exc.plugin, fld=exc.field) from exc
    return (None if raw is None else config), policies
