"""The llm-d-router Alpha scheduling plugins: utilization-filter, endpoint-attribute-filter,
endpoint-attribute-scorer, header-profile-handler, header-label-affinity-scorer."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError, SchedulingFailed
from epp.framework.endpoint import Endpoint, Metrics
from epp.framework.plugins import Handle, ResponseHeaders
from epp.plugins.filters.decode_filter import DecodeFilter
from epp.plugins.filters.encode_filter import EncodeFilter
from epp.plugins.filters.prefill_filter import PrefillFilter
from epp.plugins.pickers.max_score import MaxScorePicker
from epp.plugins.scorers.queue import QueueScorer
from epp.scheduling.scheduler import Scheduler, SchedulerProfile, WeightedScorer

from .helpers import cycle, ep, make, names, registry, req


def valued(name: str, value: float | None, key: str = "depth", **kw: Any) -> Endpoint:
    """An endpoint whose custom metric ``key`` (a core-metrics-extractor ``customMetrics`` attribute) is ``value``
    (None: the scrape lacked it)."""
    e = ep(name, **kw)
    e.metrics = Metrics(waiting=e.metrics.waiting, running=e.metrics.running, kv_usage=e.metrics.kv_usage,
                        update_time=1.0, custom={} if value is None else {key: value})
    return e


def build(type_name: str, raw: dict[str, Any] | None, name: str = "p") -> Any:
    return registry().create(type_name, name, raw, Handle())


def config_error(type_name: str, raw: dict[str, Any] | None, name: str = "p") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build(type_name, raw, name)
    assert info.value.plugin == name and f"plugin '{name}' (type: {type_name})" in str(info.value)
    return info.value


# -- utilization-filter ---------------------------------------------------------------------------------------

FLEET = [ep("idle"), ep("queued", waiting=12, inflight=3), ep("busy", running=40, inflight=70),
         ep("full", kv=0.95, inflight=5)]


@pytest.mark.parametrize("conditions,expected", [
    ([{"metric": "waiting-queue", "maxValue": 10}], ["idle", "busy", "full"]),
    ([{"metric": "running-requests", "maxValue": 40}], ["idle", "queued", "busy", "full"]),
    ([{"metric": "kv-cache-utilization", "maxValue": 0.9}], ["idle", "queued", "busy"]),
    ([{"metric": "active-requests", "maxValue": 5}], ["idle", "queued", "full"]),
    ([{"metric": "waiting-queue", "maxValue": 10}, {"metric": "active-requests", "maxValue": 64},
      {"metric": "kv-cache-utilization", "maxValue": 0.9}], ["idle"]),
], ids=["waiting", "running-cap-inclusive", "kv-fraction", "active-is-epp-inflight", "every-condition-must-hold"])
def test_utilization_filter_keeps_endpoints_within_every_cap(conditions: list[dict], expected: list[str]) -> None:
    flt = build("utilization-filter", {"conditions": conditions})
    assert names(flt.filter(cycle(), req(), FLEET)) == expected


def test_utilization_filter_fallback_on_empty_returns_the_candidates() -> None:
    raw: dict[str, Any] = {"conditions": [{"metric": "active-requests", "maxValue": 0}]}
    busy = [ep("a", inflight=1), ep("b", inflight=2)]
    assert build("utilization-filter", raw).filter(cycle(), req(), busy) == []
    assert names(build("utilization-filter", {**raw, "fallbackOnEmpty": True}).filter(cycle(), req(), busy)) == \
        ["a", "b"]


@pytest.mark.parametrize("raw,field", [
    ({}, "conditions"),
    ({"conditions": []}, "conditions"),
    ({"conditions": [{"metric": "gpu-temperature", "maxValue": 1}]}, "conditions.0.metric"),
    ({"conditions": [{"metric": "waiting-queue"}]}, "conditions.0.maxValue"),
    ({"conditions": [{"metric": "waiting-queue", "maxValue": 4}, {"metric": "running-requests", "maxValue": -1}]},
     "conditions.1.maxValue"),
    ({"conditions": [{"metric": "kv-cache-utilization", "maxValue": 90}]}, "conditions.0.maxValue"),
    ({"conditions": [{"metric": "waiting-queue", "maxValue": 4}], "fallback": True}, "fallback"),
], ids=["no-parameters", "no-conditions", "unknown-metric", "no-max-value", "negative-max", "kv-above-one",
        "unknown-key"])
def test_utilization_filter_parameter_errors_name_the_field(raw: dict, field: str) -> None:
    assert config_error("utilization-filter", raw).field == field


def test_utilization_filter_load_producer_name_is_checked_only_for_active_requests() -> None:
    raw = {"conditions": [{"metric": "active-requests", "maxValue": 4}], "inFlightLoadProducerName": "nope"}
    flt = build("utilization-filter", raw)
    handle = Handle()
    handle.add(flt)
    with pytest.raises(ConfigError) as info:
        flt.bind(handle)
    assert info.value.field == "inFlightLoadProducerName"
    queue_only = build("utilization-filter", {**raw, "conditions": [{"metric": "waiting-queue", "maxValue": 4}]})
    queue_only.bind(handle)  # the reference reads the producer only for active-requests


# -- endpoint-attribute-filter --------------------------------------------------------------------------------

VALUED = [valued("v5", 5), valued("v10", 10), valued("none", None), valued("v15", 15), valued("v0", 0)]


def attribute_filter(algorithm: dict, **extra: Any) -> Any:
    return build("endpoint-attribute-filter", {"attribute": "depth", "algorithm": algorithm, **extra})


@pytest.mark.parametrize("operator,value,expected", [
    ("LessThan", 10, ["v5", "none", "v0"]),
    ("LessThanOrEqual", 10, ["v5", "v10", "none", "v0"]),
    ("GreaterThan", 10, ["none", "v15"]),
    ("GreaterThanOrEqual", 10, ["v10", "none", "v15"]),
    ("Equal", 10, ["v10", "none"]),
    ("NotEqual", 10, ["v5", "none", "v15", "v0"]),
])
def test_endpoint_attribute_filter_threshold_keeps_order_and_missing_by_default(
        operator: str, value: float, expected: list[str]) -> None:
    flt = attribute_filter({"type": "threshold", "threshold": {"operator": operator, "value": value}})
    assert names(flt.filter(cycle(), req(), VALUED)) == expected


@pytest.mark.parametrize("algorithm,expected", [
    ({"type": "range", "range": {"min": 5, "max": 10}}, ["v5", "v10"]),
    ({"type": "topK", "topK": {"k": 2, "higherIsBetter": True}}, ["v15", "v10"]),
    ({"type": "topK", "topK": {"k": 2}}, ["v0", "v5"]),
    ({"type": "topK", "topK": {"k": 9}}, ["v5", "v10", "v15", "v0"]),
    ({"type": "percentile", "percentile": {"percentile": 50, "higherIsBetter": True}}, ["v5", "v10", "v15"]),
    ({"type": "percentile", "percentile": {"percentile": 25}}, ["v0"]),
    ({"type": "percentile", "percentile": {"percentile": 0}}, ["v0"]),
], ids=["range-inclusive", "top-k-highest", "top-k-lowest-by-default", "k-above-count-keeps-all",
        "percentile-at-or-above", "percentile-at-or-below", "percentile-zero-is-rank-one"])
def test_endpoint_attribute_filter_algorithms_with_on_missing_fail(algorithm: dict, expected: list[str]) -> None:
    flt = attribute_filter(algorithm, onMissing="Fail")
    assert names(flt.filter(cycle(), req(), VALUED)) == expected


def test_endpoint_attribute_filter_ranked_algorithms_append_missing_endpoints_when_they_pass() -> None:
    flt = attribute_filter({"type": "topK", "topK": {"k": 1, "higherIsBetter": True}})
    assert names(flt.filter(cycle(), req(), VALUED)) == ["v15", "none"]


def test_endpoint_attribute_filter_fallback_on_empty() -> None:
    algorithm = {"type": "threshold", "threshold": {"operator": "GreaterThan", "value": 100}}
    assert attribute_filter(algorithm, onMissing="Fail").filter(cycle(), req(), VALUED) == []
    kept = attribute_filter(algorithm, onMissing="Fail", fallbackOnEmpty=True).filter(cycle(), req(), VALUED)
    assert names(kept) == names(VALUED)


def test_endpoint_attribute_filter_reads_another_producers_attribute_from_endpoint_attributes() -> None:
    hot, cool, custom_only = ep("hot"), ep("cool"), valued("custom-only", 1.0, key="gpu_temp")
    hot.attributes["gpu_temp/dcgm-extractor"] = 85.0
    cool.attributes["gpu_temp/dcgm-extractor"] = 60
    raw = {"attribute": "gpu_temp", "producer": "dcgm-extractor", "onMissing": "Fail",
           "algorithm": {"type": "threshold", "threshold": {"operator": "LessThan", "value": 80}}}
    assert names(build("endpoint-attribute-filter", raw).filter(cycle(), req(), [hot, cool, custom_only])) == ["cool"]
    agnostic = ep("agnostic")
    agnostic.attributes["llm-d.ai/queue"] = 3
    raw = {**raw, "attribute": "llm-d.ai/queue", "producer": ""}
    assert names(build("endpoint-attribute-filter", raw).filter(cycle(), req(), [agnostic, hot])) == ["agnostic"]


@pytest.mark.parametrize("raw,field", [
    ({"algorithm": {"type": "threshold", "threshold": {"operator": "LessThan", "value": 1}}}, "attribute"),
    ({"attribute": "a/b", "algorithm": {"type": "threshold", "threshold": {"operator": "LessThan"}}}, "attribute"),
    ({"attribute": "a", "onMissing": "Maybe", "algorithm": {"type": "range", "range": {}}}, "onMissing"),
    ({"attribute": "a"}, "algorithm.type"),
    ({"attribute": "a", "algorithm": {"type": "median"}}, "algorithm.type"),
    ({"attribute": "a", "algorithm": {"type": "threshold"}}, "algorithm.threshold"),
    ({"attribute": "a", "algorithm": {"type": "threshold", "threshold": {"operator": "Around"}}},
     "algorithm.threshold.operator"),
    ({"attribute": "a", "algorithm": {"type": "range", "range": {"min": 2, "max": 1}}}, "algorithm.range"),
    ({"attribute": "a", "algorithm": {"type": "topK", "topK": {"k": 0}}}, "algorithm.topK.k"),
    ({"attribute": "a", "algorithm": {"type": "percentile", "percentile": {"percentile": 101}}},
     "algorithm.percentile.percentile"),
], ids=["no-attribute", "combined-attribute-producer", "bad-on-missing", "no-algorithm", "unknown-algorithm",
        "threshold-block-missing", "bad-operator", "range-min-above-max", "top-k-zero", "percentile-above-100"])
def test_endpoint_attribute_filter_parameter_errors_name_the_field(raw: dict, field: str) -> None:
    assert config_error("endpoint-attribute-filter", raw).field == field


# -- endpoint-attribute-scorer --------------------------------------------------------------------------------

SCORED = [valued("v2", 2), valued("v4", 4), valued("none", None), valued("v10", 10)]


def attribute_scorer(algorithm: dict, **extra: Any) -> Any:
    return build("endpoint-attribute-scorer", {"attributeKey": "depth", "algorithm": algorithm, **extra})


@pytest.mark.parametrize("algorithm,expected", [
    ({"type": "linear_lower_is_better"}, [1.0, 0.75, 0.0, 0.0]),
    ({"type": "linear_higher_is_better"}, [0.0, 0.25, 0.0, 1.0]),
    ({"type": "linear_higher_is_better", "normalization": {"adaptiveRange": {}}}, [0.0, 0.25, 0.0, 1.0]),
    ({"type": "linear_lower_is_better", "normalization": {"fixedRange": {"min": 0, "max": 8}}},
     [0.75, 0.5, 0.0, 0.0]),
    ({"type": "linear_higher_is_better", "normalization": {"fixedRange": {"min": 0, "max": 8}}},
     [0.25, 0.5, 0.0, 1.0]),
], ids=["adaptive-lower", "adaptive-higher", "adaptive-explicit", "fixed-lower-clamped", "fixed-higher-clamped"])
def test_endpoint_attribute_scorer_linear_normalisation(algorithm: dict, expected: list[float]) -> None:
    assert attribute_scorer(algorithm).score(cycle(), req(), SCORED) == pytest.approx(expected)


def test_endpoint_attribute_scorer_equal_values_are_neutral_and_missing_scores_zero() -> None:
    scorer = attribute_scorer({"type": "linear_lower_is_better"})
    same = [valued("a", 3), valued("b", 3), valued("c", None)]
    assert scorer.score(cycle(), req(), same) == [1.0, 1.0, 0.0]
    assert scorer.score(cycle(), req(), [valued("x", None)]) == [0.0]
    assert scorer.score(cycle(), req(), []) == []


@pytest.mark.parametrize("raw,field", [
    ({"algorithm": {"type": "linear_lower_is_better"}}, "attributeKey"),
    ({"attributeKey": "d"}, "algorithm.type"),
    ({"attributeKey": "d", "algorithm": {"type": "log"}}, "algorithm.type"),
    ({"attributeKey": "d", "algorithm": {"type": "linear_lower_is_better",
                                         "normalization": {"fixedRange": {"min": 0, "max": 1}, "adaptiveRange": {}}}},
     "algorithm.normalization"),
    ({"attributeKey": "d", "algorithm": {"type": "linear_lower_is_better",
                                         "normalization": {"fixedRange": {"min": 1, "max": 1}}}},
     "algorithm.normalization.fixedRange"),
    ({"attributeKey": "d", "source": "pod", "algorithm": {"type": "linear_lower_is_better"}}, "source"),
    ({"source": "metadata", "algorithm": {"type": "linear_lower_is_better"}}, "metadataNamespace"),
    ({"source": "metadata", "metadataNamespace": "ns", "metadataField": "cost",
      "algorithm": {"type": "linear_lower_is_better"}}, "source"),
], ids=["no-attribute-key", "no-algorithm", "unknown-algorithm", "two-normalizations", "empty-fixed-range",
        "unknown-source", "metadata-without-location", "metadata-unsupported"])
def test_endpoint_attribute_scorer_parameter_errors_name_the_field(raw: dict, field: str) -> None:
    assert config_error("endpoint-attribute-scorer", raw).field == field


# -- header-profile-handler -----------------------------------------------------------------------------------

STAGES = [ep("e1", role="encode"), ep("p1", role="prefill", waiting=2), ep("p2", role="prefill"),
          ep("d1", role="decode", waiting=5), ep("d2", role="decode", waiting=1)]


def _stage(name: str, flt: Any) -> SchedulerProfile:
    return SchedulerProfile(name, [flt], [WeightedScorer(make(QueueScorer), 1.0)],
                            make(MaxScorePicker, rng=random.Random(0)))


def stage_scheduler(raw: dict[str, Any] | None = None, *only: str) -> Scheduler:
    profiles = {"encode": _stage("encode", make(EncodeFilter)), "prefill": _stage("prefill", make(PrefillFilter)),
                "decode": _stage("decode", make(DecodeFilter))}
    chosen = {n: p for n, p in profiles.items() if not only or n in only}
    return Scheduler(chosen, build("header-profile-handler", raw, "by-header"))


@pytest.mark.parametrize("headers,primary,target", [
    ({"epp-profile": "prefill"}, "prefill", "p2"),
    ({"epp-profile": "  encode "}, "encode", "e1"),
    ({}, "decode", "d2"),
    ({"epp-profile": "   "}, "decode", "d2"),
], ids=["header-names-profile", "value-trimmed", "missing-header-runs-default", "blank-header-runs-default"])
def test_header_profile_handler_runs_exactly_the_named_profile(headers: dict, primary: str, target: str) -> None:
    result = stage_scheduler().schedule(req(headers=headers), STAGES)
    assert result.primary_profile == primary and list(result.profile_results) == [primary]
    assert result.target.name == target


def test_header_profile_handler_custom_header_and_default() -> None:
    sched = stage_scheduler({"headerName": " X-Stage ", "defaultProfile": " prefill "})
    assert sched.schedule(req(), STAGES).primary_profile == "prefill"
    assert sched.schedule(req(headers={"x-stage": "encode"}), STAGES).primary_profile == "encode"
    assert sched.schedule(req(headers={"epp-profile": "encode"}), STAGES).primary_profile == "prefill"


def test_header_profile_handler_single_profile_always_runs() -> None:
    sched = stage_scheduler(None, "prefill")
    assert sched.schedule(req(headers={"epp-profile": "decode"}), STAGES).primary_profile == "prefill"


def test_header_profile_handler_unknown_value_fails_and_logs_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    sched = stage_scheduler()
    request = req(headers={"epp-profile": "Decode"})  # profile names are case-sensitive
    with caplog.at_level(logging.INFO, logger="epp.plugins.header_profile"), pytest.raises(SchedulingFailed) as info:
        sched.schedule(request, STAGES)
    assert str(info.value).endswith(f"failed to run any scheduler profile for request {request.request_id}")
    assert "header value 'Decode'" in caplog.text


def test_header_profile_handler_unconfigured_default_fails(caplog: pytest.LogCaptureFixture) -> None:
    sched = stage_scheduler({"defaultProfile": "verify"})
    with caplog.at_level(logging.INFO, logger="epp.plugins.header_profile"), pytest.raises(SchedulingFailed):
        sched.schedule(req(), STAGES)
    assert "defaultProfile 'verify' is not a configured scheduling profile" in caplog.text


def test_header_profile_handler_profile_without_endpoint_fails() -> None:
    with pytest.raises(SchedulingFailed, match="failed to run scheduler profile 'encode'"):
        stage_scheduler().schedule(req(headers={"epp-profile": "encode"}), STAGES[1:])


def test_header_profile_handler_unknown_parameter_is_an_error() -> None:
    assert config_error("header-profile-handler", {"header": "x"}).field == "header"


# -- header-label-affinity-scorer -----------------------------------------------------------------------------

SLICES = [ep("a", labels={"slice": "0"}), ep("b", labels={"slice": "1"}), ep("c"), ep("d", labels={"slice": ""})]


@pytest.mark.parametrize("headers,expected", [
    ({"x-disagg-slice": "1"}, [0.0, 1.0, 0.0, 0.0]),
    ({"x-disagg-slice": "7"}, [0.0, 0.0, 0.0, 0.0]),
    ({"x-disagg-slice": ""}, [0.0, 0.0, 0.0, 0.0]),
    ({}, [0.0, 0.0, 0.0, 0.0]),
], ids=["matching-label", "unknown-value-soft-miss", "empty-header", "no-header"])
def test_header_label_affinity_scores_matching_label(headers: dict, expected: list[float]) -> None:
    scorer = build("header-label-affinity-scorer", {"headerName": "X-Disagg-Slice", "labelKey": "slice"})
    assert scorer.score(cycle(), req(headers=headers), SLICES) == expected


@pytest.mark.parametrize("stamp,endpoint,expected", [
    (None, SLICES[1], {"x-disagg-slice": "1"}),
    (True, SLICES[0], {"x-disagg-slice": "0"}),
    (False, SLICES[0], {}),
    (True, SLICES[2], {}),
], ids=["default-stamps", "stamps-actual-selection", "disabled", "endpoint-without-label"])
def test_header_label_affinity_stamps_the_served_endpoints_label(stamp: bool | None, endpoint: Endpoint,
                                                                 expected: dict) -> None:
    raw: dict[str, Any] = {"headerName": "X-Disagg-Slice", "labelKey": "slice"}
    if stamp is not None:
        raw["stampResponseHeader"] = stamp
    response = ResponseHeaders(200)
    build("header-label-affinity-scorer", raw).response_header(req(headers={"x-disagg-slice": "1"}), response,
                                                               endpoint)
    assert response.headers == expected


@pytest.mark.parametrize("raw,field", [
    (None, "headerName"),
    ({"labelKey": "slice"}, "headerName"),
    ({"headerName": "x-slice"}, "labelKey"),
    ({"headerName": "", "labelKey": "slice"}, "headerName"),
    ({"headerName": "x", "labelKey": "slice", "stamp": False}, "stamp"),
], ids=["no-parameters", "no-header-name", "no-label-key", "empty-header-name", "unknown-key"])
def test_header_label_affinity_parameter_errors_name_the_field(raw: dict | None, field: str) -> None:
    assert config_error("header-label-affinity-scorer", raw).field == field


# -- all five in one config, through the real loader ----------------------------------------------------------

ALPHA_CONFIG = """\
apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
plugins:
- type: prefill-filter
- type: decode-filter
- type: utilization-filter
  parameters:
    conditions:
    - {metric: waiting-queue, maxValue: 10}
    - {metric: active-requests, maxValue: 64}
    fallbackOnEmpty: true
    inFlightLoadProducerName: inflight-load-producer
- type: inflight-load-producer
- type: endpoint-attribute-filter
  name: shallow-queues
  parameters:
    attribute: depth
    onMissing: Pass
    algorithm: {type: threshold, threshold: {operator: LessThan, value: 100}}
- type: endpoint-attribute-scorer
  name: depth-scorer
  parameters:
    attributeKey: depth
    algorithm: {type: linear_lower_is_better}
- type: header-label-affinity-scorer
  name: slice-affinity
  parameters: {headerName: x-disagg-slice, labelKey: slice}
- type: header-profile-handler
- type: max-score-picker
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: utilization-filter
  - pluginRef: depth-scorer
  - pluginRef: max-score-picker
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: shallow-queues
  - pluginRef: depth-scorer
  - pluginRef: slice-affinity
    weight: 3
  - pluginRef: max-score-picker
"""


def test_a_config_using_all_five_alpha_plugins_loads_and_schedules() -> None:
    pipeline = build_pipeline(*load_raw(ALPHA_CONFIG, "alpha.yaml"), registry())
    handler = pipeline.scheduler.handler
    assert handler.type_name == "header-profile-handler" and handler.name == "header-profile-handler"
    assert [h.name for h in pipeline.response_header] == ["slice-affinity"]
    pool = [valued("p-deep", 50, role="prefill"), valued("p-shallow", 5, role="prefill"),
            valued("p-queued", 0, role="prefill", waiting=30),  # best depth, dropped by utilization-filter
            valued("d0", 1, role="decode", labels={"slice": "0"}),
            valued("d1", 40, role="decode", labels={"slice": "1"}),
            valued("d-deep", 150, role="decode", labels={"slice": "1"})]  # dropped by shallow-queues
    prefill = pipeline.scheduler.schedule(req(headers={"epp-profile": "prefill"}), pool)
    assert prefill.primary_profile == "prefill" and prefill.target.name == "p-shallow"
    assert pipeline.scheduler.schedule(req(), pool).target.name == "d0"
    decode = pipeline.scheduler.schedule(req(headers={"x-disagg-slice": "1"}), pool)
    assert decode.primary_profile == "decode" and decode.target.name == "d1"


def test_the_loader_reports_an_alpha_plugins_bad_parameter_with_its_name_and_line() -> None:
    text = ALPHA_CONFIG.replace("operator: LessThan", "operator: Below")
    with pytest.raises(ConfigError) as info:
        build_pipeline(*load_raw(text, "alpha.yaml"), registry())
    assert info.value.plugin == "shallow-queues" and info.value.field == "algorithm.threshold.operator"
    line = "    algorithm: {type: threshold, threshold: {operator: Below, value: 100}}"
    assert info.value.line == text.splitlines().index(line) + 1
