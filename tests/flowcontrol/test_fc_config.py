"""The ``flowControl`` section: value parsing, tenant defaults, band templates, and loading through the config."""

from __future__ import annotations

import textwrap

import pytest
from pydantic import ValidationError

from epp.config import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.flowcontrol import (FlowControlConfig, FlowController, LegacyAdmission, TenantConfig, build_admission,
                             parse_byte_size, parse_duration, resolve_priority)
from epp.flowcontrol.config import DEFAULT_BAND_MAX_BYTES
from epp.framework import Handle
from epp.registry import default_registry

from fc_helpers import FakeDetector, make_request


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


@pytest.mark.parametrize("text, size", [
    ("1Gi", 2**30), ("500M", 500_000_000), ("1k", 1000), ("64Ki", 65536), (1024, 1024), ("1000", 1000),
    ("1.5Gi", 3 * 2**29),
], ids=str)
def test_parse_byte_size(text: object, size: int) -> None:
    assert parse_byte_size(text) == size


@pytest.mark.parametrize("bad", ["1GB", "lots", -1, 1.5, False], ids=repr)
def test_parse_byte_size_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_byte_size(bad)


def test_reference_schema_and_defaults() -> None:
    cfg = FlowControlConfig.model_validate({
        "maxBytes": "2Gi", "maxRequests": 100, "defaultRequestTTL": "30s",
        "defaultPriorityBand": {"maxRequests": 7, "orderingPolicyRef": "edf-ordering-policy"},
        "priorityBands": [{"priority": 10, "maxBytes": "1Mi", "fairnessPolicyRef": "round-robin-fairness-policy"}],
        "usageLimitPolicyPluginRef": "static-usage-limit-policy",
    })
    assert (cfg.max_bytes, cfg.max_requests, cfg.default_request_ttl) == (2**30 * 2, 100, 30.0)
    listed = cfg.band(10)
    assert (listed.byte_limit, listed.request_limit, listed.ordering_policy_ref) == (2**20, 0, "fcfs-ordering-policy")
    templated = cfg.band(-3)
    assert (templated.priority, templated.request_limit, templated.byte_limit) == (-3, 7, DEFAULT_BAND_MAX_BYTES)
    assert templated.ordering_policy_ref == "edf-ordering-policy"


def test_empty_section_is_all_defaults() -> None:
    cfg = FlowControlConfig.model_validate({})
    band = cfg.band(0)
    assert (band.fairness_policy_ref, band.ordering_policy_ref) == ("global-strict-fairness-policy",
                                                                    "fcfs-ordering-policy")
    assert cfg.default_request_ttl == 0 and cfg.tenant("anyone") == (TenantConfig(), False)


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
    ({"priority": 0, "fairnessPolicyRef": "nope"}, "'nope' is neither a configured plugin nor a built-in fairness"),
    ({"priority": 0, "orderingPolicyRef": "lifo"}, "'lifo' is neither a configured plugin nor a built-in ordering"),
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
