"""The current reference's newer ``epp serve`` flags (llm-d-router ``pkg/epp/server/options.go``):
``--feature-gates``, ``--emit-endpoint-scores``, ``--fairness-id-metric-label-limit``, ``--tls-min-version``,
``--tls-cipher-suites`` and ``--plugin-state-staleness-threshold``; and the label cap they set."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from epp.cli.main import build_parser
from epp.cli.serve import options_from_args
from epp.config.loader import build_pipeline, load_raw
from epp.flowcontrol.metrics import FlowControlMetrics
from epp.framework.plugins import ResponseInfo
from epp.framework.request import parse_request
from epp.metrics.families import EppMetrics
from epp.metrics.instruments import LabelCap
from epp.runtime.app import EppApp, ServeOptions
from epp.runtime.builtins import default_registry

FLOW_ON = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nfeatureGates: [flowControl]\n"
NTPOT = "llm_d_epp_request_ntpot_seconds_count"


def options(*args: str) -> ServeOptions:
    return options_from_args(build_parser().parse_args(["serve", "--endpoints", "e.yaml", *args]))


def test_the_flags_reach_serve_options() -> None:
    opts = options("--feature-gates=flowControl", "--feature-gates", " dataLayer=false, ,flowControl=false",
                   "--emit-endpoint-scores", "--fairness-id-metric-label-limit=5", "--tls-min-version=VersionTLS13",
                   "--tls-cipher-suites", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "--plugin-state-staleness-threshold",
                   "10m")
    assert opts.feature_gates == ("flowControl", "dataLayer=false", "flowControl=false")
    assert opts.emit_endpoint_scores and opts.fairness_id_label_limit == 5
    assert opts.tls_policy.min_version is ssl.TLSVersion.TLSv1_3
    assert opts.tls_policy.ciphers == "ECDHE-RSA-AES128-GCM-SHA256"
    defaults = options()
    assert (defaults.feature_gates, defaults.emit_endpoint_scores, defaults.fairness_id_label_limit) == ((), False,
                                                                                                      1000)
    assert defaults.tls_policy.is_default


@pytest.mark.parametrize(("args", "message"), [
    (("--feature-gates=nope",), "--feature-gates: feature gate 'nope' is unknown"),
    (("--feature-gates=flowControl=maybe",), "maybe is not a valid value for the feature gate flowControl"),
    (("--tls-min-version=TLS1.3",), "invalid tls-min-version 'TLS1.3': unknown TLS version"),
    (("--tls-cipher-suites=FOO",), "invalid tls-cipher-suites: unknown cipher suite 'FOO'"),
    (("--fairness-id-metric-label-limit=-1",), "fairness-id-metric-label-limit must be non-negative, got -1"),
    (("--plugin-state-staleness-threshold=0s",), "plugin-state-staleness-threshold must be positive"),
])
def test_bad_values_get_the_references_errors(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        options(*args)


def test_feature_gates_apply_after_the_configs_own() -> None:
    registry = default_registry(entry_points=False)
    assert "flowControl" in build_pipeline(*load_raw(FLOW_ON), registry).feature_gates
    assert "flowControl" not in build_pipeline(*load_raw(FLOW_ON), registry, ["flowControl=false"]).feature_gates
    off = build_pipeline(*load_raw(""), registry, ["flowControl"])
    assert "flowControl" in off.feature_gates and off.flow_policies is not None  # flow control is built for it
    assert off.source_config is not None and off.source_config.feature_gates == []  # the config is left as written


def test_epp_serve_loads_its_config_under_the_flags_gates(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(FLOW_ON)
    app = EppApp(ServeOptions(config=str(config), endpoints=[], feature_gates=("flowControl=false",)))
    assert "flowControl" not in app.pipeline.feature_gates
    app = EppApp(ServeOptions(config_text="", endpoints=[], feature_gates=("flowControl",)))
    assert "flowControl" in app.pipeline.feature_gates


def test_a_label_cap_passes_the_first_values_and_folds_the_rest() -> None:
    cap = LabelCap(2)
    assert [cap(v) for v in ("a", "b", "c", "a", "d", "b")] == ["a", "b", "other", "a", "other", "b"]
    assert [LabelCap(0)(v) for v in ("a", "")] == ["other", "other"]
    with pytest.raises(ValueError):
        LabelCap(-1)


def test_request_metrics_fold_fairness_ids_over_the_limit() -> None:
    registry = CollectorRegistry()
    metrics = EppMetrics(registry, fairness_ids=LabelCap(1))
    done = ResponseInfo(prompt_tokens=3, completion_tokens=2)
    for tenant in ("alice", "bob", "carol", "alice"):
        metrics.completed("m", "m", 0.1, done, fairness_id=tenant)
    counts = {labels["fairness_id"]: value for labels, value in _samples(registry, NTPOT)}
    assert counts == {"alice": 2, "other": 2}


def test_flow_control_metrics_fold_and_sum_in_flight_gauges() -> None:
    registry = CollectorRegistry()
    metrics = FlowControlMetrics(registry, "pool", LabelCap(1))
    request = parse_request("/v1/completions", b'{"model": "m", "prompt": "x"}',
                            {"x-gateway-inference-fairness-id": "carol"})
    metrics.inflight("alice", 1, 10)  # the first id seen keeps its series
    metrics.inflight("bob", 2, 20)
    metrics.inflight("carol", 1, 5)
    metrics.rejected(request, "capacity")  # carol's
    inflight = "inference_extension_flow_control_tenant_inflight_requests"
    assert {l["fairness_id"]: v for l, v in _samples(registry, inflight)} == {"alice": 1, "other": 3}
    metrics.inflight("bob", 0, 0)
    assert {l["fairness_id"]: v for l, v in _samples(registry, inflight)} == {"alice": 1, "other": 1}
    rejections = "inference_extension_flow_control_rejections_total"
    assert [l["fairness_id"] for l, _ in _samples(registry, rejections)] == ["other"]


def _samples(registry: CollectorRegistry, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for family in registry.collect() for s in family.samples if s.name == name]
