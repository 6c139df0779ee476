"""The ``flowControl`` section: value parsing, tenant defaults, band templates, and loading through the config."""

from __future__ import annotations

import textwrap

import pytest
from pydantic import ValidationError

from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.flowcontrol import (
    FlowControlConfig,
    FlowController,
    LegacyAdmission,
    TenantConfig,
    build_admission,
    parse_duration,
    resolve_priority,
)
from epp.flowcontrol.config import DEFAULT_BAND_MAX_BYTES, DEFAULT_BAND_MAX_REQUESTS, parse_quantity
from epp.framework.plugins import Handle
from epp.runtime.builtins import default_registry

from .helpers import FakeDetector, make_request


@pytest.mark.parametrize("text, seconds", [
    ("30s", 30.0), ("200ms", 0.2), ("1m30s", 90.0), ("1h", 3600.0), ("0", 0.0), ("1.5s", 1.5), ("250us", 250e-6),
    (2, 2.0), (0.5, 0.5),
], ids=str)
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "30", "s", "1d", "-1s", True, None, "1s garbage"], ids=repr)
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize("text, value", [
    ("1Gi", 2**30), ("500M", 500_000_000), ("1k", 1000), ("2k", 2000), ("64Ki", 65536), (1024, 1024), ("1000", 1000),
    ("1.5Gi", 3 * 2**29), ("1e3", 1000), ("1E3", 1000), (" 7 ", 7), ("+5", 5), ("0", 0),
    (1.5, 2), ("1.5", 2), ("100m", 1), (".5", 1),  # resource.Quantity.Value() rounds up
], ids=repr)
def test_parse_quantity(text: object, value: int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["1GB", "lots", "1e", "", "k", -1, "-1", "1e999", False, None, float("nan")],
                         ids=repr)
def test_parse_quantity_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(bad)


def test_reference_schema_and_defaults() -> None:
    cfg = FlowControlConfig.model_validate({
        "maxBytes": "2Gi", "maxRequests": 100, "defaultRequestTTL": "30s",
        "defaultPriorityBand": {"maxRequests": 7, "orderingPolicyRef": "edf-ordering-policy"},
        "priorityBands": [{"priority": 10, "maxBytes": "1Mi", "fairnessPolicyRef": "round-robin-fairness-policy"}],
        "usageLimitPolicyPluginRef": "static-usage-limit-policy",
    })
    assert (cfg.max_bytes, cfg.max_requests, cfg.default_request_ttl) == (2**30 * 2, 100, 30.0)
    listed = cfg.band(10)
    assert (listed.byte_limit, listed.request_limit) == (2**20, DEFAULT_BAND_MAX_REQUESTS)  # omitted: 5000
    assert listed.ordering_policy_ref == "fcfs-ordering-policy"
    templated = cfg.band(-3)
    assert (templated.priority, templated.request_limit, templated.byte_limit) == (-3, 7, DEFAULT_BAND_MAX_BYTES)
    assert templated.ordering_policy_ref == "edf-ordering-policy"


def test_empty_section_is_all_defaults() -> None:
    cfg = FlowControlConfig.model_validate({})
    band = cfg.band(0)
    assert (band.fairness_policy_ref, band.ordering_policy_ref) == ("global-strict-fairness-policy",
                                                                    "fcfs-ordering-policy")
    assert (cfg.default_request_ttl, cfg.no_endpoint_request_ttl) == (60.0, 60.0)  # the reference's defaults
    assert cfg.default_negative_priority_band is None and cfg.band(0).request_limit == 5000
    assert cfg.tenant("anyone") == (TenantConfig(), False)


@pytest.mark.parametrize("raw, field", [
    ({"maxBytz": 1}, "maxBytz"),
    ({"priorityBands": [{"priority": 1}, {"priority": 1}]}, "priorityBands"),
    ({"tenants": {"a": {"weight": 0}}}, "weight"),
    ({"tenants": {"a": {"maxConcurrent": 0}}}, "maxConcurrent"),
    ({"tenants": {"a": {"rate": {"requestsPerSecond": 0}}}}, "requestsPerSecond"),
    ({"tenants": {"a": {"unknown": 1}}}, "unknown"),
    ({"defaultRequestTTL": "soon"}, "defaultRequestTTL"),
], ids=["unknown-key", "duplicate-band", "zero-weight", "zero-concurrency", "zero-rate", "unknown-tenant-key",
        "bad-ttl"])
def test_invalid_sections_are_rejected(raw: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        FlowControlConfig.model_validate(raw)
    assert field in str(err.value)


def test_listed_tenant_inherits_unset_fields_from_defaults() -> None:
    cfg = FlowControlConfig.model_validate({"tenants": {
        "defaults": {"maxConcurrent": 4, "maxQueued": 10},
        "gold": {"weight": 3},
        "open": {"maxConcurrent": None},
    }})
    gold, registered = cfg.tenant("gold")
    assert registered and (gold.weight, gold.max_concurrent, gold.max_queued) == (3.0, 4, 10)
    open_, _ = cfg.tenant("open")
    assert open_.max_concurrent is None and open_.max_queued == 10
    unknown, registered = cfg.tenant("stranger")
    assert not registered and unknown.max_concurrent == 4
    assert cfg.tenant("defaults") == (cfg.default_tenant, False)


def test_objective_priorities() -> None:
    cfg = FlowControlConfig.model_validate({"objectives": {"batch": -1, "chat": 5}})
    assert [cfg.priority_for(o) for o in ("batch", "chat", "other", None)] == [-1, 5, 0, 0]
    assert resolve_priority(make_request(objective="chat"), cfg.objectives) == 5
    assert resolve_priority(make_request(priority=3, objective="other"), cfg.objectives) == 3


def test_section_loads_through_endpoint_picker_config() -> None:
    text = textwrap.dedent("""\
        featureGates: [flowControl]
        plugins:
        - type: queue-scorer
        - name: fair
          type: weighted-fair-fairness-policy
        - type: edf-ordering-policy
        - type: concurrency-detector
          parameters: {maxConcurrency: 8}
        saturationDetector: {pluginRef: concurrency-detector}
        flowControl:
          defaultRequestTTL: 10s
          priorityBands:
          - {priority: 0, fairnessPolicyRef: fair, orderingPolicyRef: edf-ordering-policy}
          tenants:
            defaults: {maxConcurrent: 2}
            steady: {weight: 2}
        """)
    pipeline = build_pipeline(*load_raw(text, "fc.yaml"), default_registry(entry_points=False))
    assert isinstance(pipeline.flow_control, FlowControlConfig)
    ctrl = build_admission(pipeline.flow_control, pipeline.feature_gates, pipeline.saturation_detector, None,
                           handle=pipeline.handle)
    assert isinstance(ctrl, FlowController)
    assert ctrl.policies.fairness["fair"] is pipeline.handle.plugin("fair")
    assert ctrl.detector is pipeline.handle.plugin("concurrency-detector")


def test_bad_section_names_the_line() -> None:
    text = "featureGates: [flowControl]\nflowControl:\n  tenants:\n    a: {weight: -1}\n"
    with pytest.raises(ConfigError) as err:
        build_pipeline(*load_raw(text, "fc.yaml"), default_registry(entry_points=False))
    assert "weight" in str(err.value) and err.value.line == 4


def test_gate_off_means_legacy_even_with_a_section() -> None:
    cfg = FlowControlConfig.model_validate({"maxRequests": 1})
    assert isinstance(build_admission(cfg, set(), FakeDetector(), None), LegacyAdmission)
    assert isinstance(build_admission(None, {"flowControl"}, FakeDetector(), None), FlowController)


@pytest.mark.parametrize("band, message", [
    ({"priority": 0, "fairnessPolicyRef": "nope"}, "no fairness policy registered for name 'nope'"),
    ({"priority": 0, "orderingPolicyRef": "lifo"}, "no ordering policy registered for name 'lifo'"),
    ({"priority": 0, "fairnessPolicyRef": "scorer"}, "plugin 'scorer' (type: queue-scorer) is not a fairness"),
], ids=["unknown-fairness", "unknown-ordering", "wrong-plugin-kind"])
def test_unresolvable_policy_refs_fail_at_startup(band: dict, message: str) -> None:
    handle = Handle()
    handle.add(default_registry(entry_points=False).create("queue-scorer", "scorer", None, handle))
    cfg = FlowControlConfig.model_validate({"priorityBands": [band]})
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_admission(cfg, {"flowControl"}, FakeDetector(), None, handle=handle)


def test_default_band_template_refs_are_checked_too() -> None:
    cfg = FlowControlConfig.model_validate({"defaultPriorityBand": {"fairnessPolicyRef": "missing"}})
    with pytest.raises(ConfigError, match="fairnessPolicyRef"):
        build_admission(cfg, {"flowControl"}, FakeDetector(), None)


# -- as the reference's loader: quantities, zero band limits, declared policies ---------------------------------

HEAD = "featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n"


def _load(text: str):
    return build_pipeline(*load_raw(HEAD + textwrap.dedent(text), "fc.yaml"), default_registry(entry_points=False))


def test_request_limits_are_kubernetes_quantities() -> None:
    pipeline = _load("""\
        flowControl:
          maxRequests: 1k
          maxBytes: "1.5Gi"
          priorityBands:
          - {priority: 0, maxRequests: "2k", maxBytes: 64Mi}
          - {priority: 1, maxRequests: "100"}
          defaultPriorityBand: {maxRequests: 1e3}
        """)
    cfg = pipeline.flow_control
    assert (cfg.max_requests, cfg.max_bytes) == (1000, 3 * 2**29)
    assert [(b.request_limit, b.byte_limit) for b in cfg.priority_bands] == [(2000, 64 * 2**20),
                                                                             (100, DEFAULT_BAND_MAX_BYTES)]
    assert cfg.band(9).request_limit == 1000


@pytest.mark.parametrize("section, field", [
    ("maxRequests: lots", "'maxRequests'"),
    ("maxRequests: -1", "'maxRequests'"),
    ("priorityBands: [{priority: 0, maxRequests: 2kb}]", "'priorityBands.0.maxRequests'"),
    ("defaultPriorityBand: {maxBytes: 1GB}", "'defaultPriorityBand.maxBytes'"),
], ids=["global-word", "global-negative", "band-unit", "template-unit"])
def test_bad_quantities_name_their_field(section: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load("flowControl:\n  " + section + "\n")
    assert field in str(err.value) and "quantity" in str(err.value)


def test_zero_band_bytes_mean_the_default_as_in_the_reference() -> None:
    cfg = _load("""\
        flowControl:
          maxBytes: 0
          priorityBands: [{priority: 0, maxBytes: 0, maxRequests: 0}]
          defaultPriorityBand: {maxBytes: 0}
        """).flow_control
    assert cfg.max_bytes == 0  # the global limit stays optional: 0 = none
    assert (cfg.band(0).byte_limit, cfg.band(0).request_limit) == (DEFAULT_BAND_MAX_BYTES, DEFAULT_BAND_MAX_REQUESTS)
    assert cfg.band(5).byte_limit == DEFAULT_BAND_MAX_BYTES


@pytest.mark.parametrize("field, ref", [
    ("fairnessPolicyRef", "round-robin-fairness-policy"), ("fairnessPolicyRef", "weighted-fair-fairness-policy"),
    ("orderingPolicyRef", "edf-ordering-policy"),
])
def test_policy_refs_must_name_declared_plugins(field: str, ref: str) -> None:
    kind = "fairness policy" if field == "fairnessPolicyRef" else "ordering policy"
    for section in (f"priorityBands: [{{priority: 0, {field}: {ref}}}]", f"defaultPriorityBand: {{{field}: {ref}}}"):
        with pytest.raises(ConfigError, match=f"no {kind} registered for name '{ref}'") as err:
            _load("flowControl:\n  " + section + "\n")
        assert err.value.line == 5
    declared = HEAD + f"- type: {ref}\nflowControl:\n  priorityBands: [{{priority: 0, {field}: {ref}}}]\n"
    pipeline = build_pipeline(*load_raw(declared, "fc.yaml"), default_registry(entry_points=False))
    policies = pipeline.flow_policies.fairness if field == "fairnessPolicyRef" else pipeline.flow_policies.ordering
    assert policies[ref] is pipeline.handle.plugin(ref)


def test_default_policies_need_no_declaration() -> None:
    pipeline = _load("""\
        flowControl:
          usageLimitPolicyPluginRef: static-usage-limit-policy
          priorityBands:
          - {priority: 0, fairnessPolicyRef: global-strict-fairness-policy, orderingPolicyRef: fcfs-ordering-policy}
        """)
    assert set(pipeline.flow_policies.fairness) == {"global-strict-fairness-policy"}
    assert set(pipeline.flow_policies.ordering) == {"fcfs-ordering-policy"}


@pytest.mark.parametrize("gates,value,refused", [
    ("[flowControl]", "true", True), ("[flowControl]", "false", False), ("[]", "true", False),
], ids=["gate-on-true", "gate-on-false", "gate-off-true"])
def test_enable_eviction_is_read_and_true_is_refused_with_the_gate_on(gates: str, value: str, refused: bool) -> None:
    """llm-d-router's ``flowControl.enableEviction`` (demand-driven eviction of in-flight sheddable requests):
    EPP has no eviction, so ``true`` fails at load, naming the field, where the reference would act on it."""
    text = f"featureGates: {gates}\nflowControl:\n  maxRequests: 10\n  enableEviction: {value}\n"
    if not refused:
        pipeline = build_pipeline(*load_raw(text, "fc.yaml"), default_registry(entry_points=False))
        assert pipeline.flow_control.enable_eviction is (value == "true")
        return
    with pytest.raises(ConfigError, match="flowControl.enableEviction: EPP does not terminate in-flight") as err:
        build_pipeline(*load_raw(text, "fc.yaml"), default_registry(entry_points=False))
    assert (err.value.field, err.value.line) == ("flowControl.enableEviction", 4)
