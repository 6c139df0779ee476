"""predicted-latency-producer: parameters, the reference's validity and headroom rules, and the request-control
hooks through the real Director and scheduler (training samples, state release on completion, errors, fallbacks
and TTL, disaggregation), plus its metrics.

Where a test must dictate predictions it uses ``FixedPredictor``, a stand-in at EPP's own predictor seam
(:class:`epp.latency.predictor.LatencyPredictor`); the in-process model itself is tested in tests/latency."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import pytest
from prometheus_client import CollectorRegistry

from epp.config.loader import Pipeline, build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.errors import ConfigError
from epp.framework.endpoint import ROLE_LABEL, EndpointSpec, Metrics
from epp.framework.plugins import CycleState, Handle, ProfileRunResult, ResponseInfo, SchedulingResult
from epp.latency import LATENCY_PREDICTIONS_KEY, LatencyPredictionInfo, predictions_of
from epp.latency.inprocess import InProcessPredictor
from epp.latency.metrics import LatencyMetrics
from epp.latency.predictor import LatencyFeatures, LatencyPrediction, TrainingSample
from epp.metrics.families import EppMetrics
from epp.plugins.filters.header_based_testing import SELECTION_HEADER
from epp.plugins.producers.approx_prefix_cache import ApproxPrefixCacheProducer
from epp.plugins.producers.predicted_latency import PredictedLatencyProducer
from epp.runtime.app import instrument_pipeline
from epp.scheduling.director import Director

from .helpers import ep, make, registry, req

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
TTFT, TPOT = "x-llm-d-router-slo-ttft-ms", "x-llm-d-router-slo-tpot-ms"


class FixedPredictor:
    """Returns the given predictions in order and records what it is asked and taught."""

    def __init__(self, *preds: tuple[float, float], ttft_ready: bool = True, tpot_ready: bool = True) -> None:
        self.preds = [LatencyPrediction(*p) for p in preds]
        self.ttft_ready, self.tpot_ready = ttft_ready, tpot_ready
        self.seen: list[LatencyFeatures] = []
        self.samples: list[TrainingSample] = []

    def predict_bulk(self, features: Sequence[LatencyFeatures]) -> list[LatencyPrediction]:
        self.seen = list(features)
        return (self.preds * len(features))[:len(features)] if len(self.preds) == 1 else self.preds[:len(features)]

    def add_training_data(self, samples: Iterable[TrainingSample]) -> None:
        self.samples.extend(samples)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def director(params: str = "{}", *roles: str | None) -> tuple[Director, PredictedLatencyProducer, Clock]:
    """A Director routing by the ``test-epp-endpoint-selection`` header over endpoints e0, e1 (10.0.0.1, .2), with
    the producer's clock faked."""
    text = HEAD + f"plugins:\n- type: predicted-latency-producer\n  parameters: {params}\n" \
                  "- type: header-based-testing-filter\n"
    pipeline = build_pipeline(*load_raw(text, "<test>"), registry())
    store = Datastore()
    store.replace_all([EndpointSpec(f"e{i}", f"10.0.0.{i + 1}", 8000, labels={ROLE_LABEL: r} if r else {})
                       for i, r in enumerate(roles or (None, None))])
    for e in store.endpoints():
        e.metrics = Metrics(update_time=1e12, kv_usage=0.25, waiting=1)
    store.mark_synced()
    plugin = producer(pipeline)
    clock = plugin.clock = Clock()
    return Director(pipeline, store), plugin, clock


def producer(pipeline: Pipeline) -> PredictedLatencyProducer:
    found = pipeline.handle.first_of_type("predicted-latency-producer")
    assert isinstance(found, PredictedLatencyProducer)
    return found


def to(endpoint: int, **headers: str) -> dict[str, str]:
    return {SELECTION_HEADER: f"10.0.0.{endpoint + 1}:8000", **headers}


# -- parameters ---------------------------------------------------------------------------------------------------


def test_defaults_are_the_references() -> None:
    p = make(PredictedLatencyProducer).params
    assert (p.sampling_mean, p.max_decode_token_samples_for_prediction, p.slo_buffer_factor, p.context_ttl,
            p.streaming_mode, p.endpoint_role_label, p.predict_in_produce) == (1000, 0, 1, 300.0, False, "", True)
    assert (p.predictor.min_samples, p.predictor.objective, p.predictor.quantile) == (10, "quantile", 0.9)


@pytest.mark.parametrize("raw,seconds", [({"contextTTL": "90s"}, 90.0), ({"contextTTL": 2_000_000_000}, 2.0),
                                         ({"contextTTL": "0"}, 0.0)], ids=["go-string", "nanoseconds", "zero"])
def test_context_ttl_forms(raw: dict[str, Any], seconds: float) -> None:
    plugin = registry().create("predicted-latency-producer", "p", raw, Handle())
    assert plugin.params.context_ttl == seconds


@pytest.mark.parametrize("raw,field", [
    ({"samplingMean": 0}, "samplingMean"), ({"maxDecodeTokenSamplesForPrediction": -1},
                                            "maxDecodeTokenSamplesForPrediction"),
    ({"sloBufferFactor": 0}, "sloBufferFactor"), ({"contextTTL": 1.5}, "contextTTL"),
    ({"contextTTL": "-1s"}, "contextTTL"), ({"streamingMode": "yes"}, "streamingMode"),
    ({"predictor": {"minSamples": 1}}, "predictor.minSamples"), ({"predictor": {"objective": "p99"}},
                                                                 "predictor.objective"),
    ({"samplingmean": 5}, "samplingmean"),
], ids=["samplingMean", "maxDecodeTokenSamples", "sloBufferFactor", "ttl-float", "ttl-negative", "streaming-type",
        "minSamples", "objective", "unknown"])
def test_bad_values_are_config_errors_naming_plugin_and_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        registry().create("predicted-latency-producer", "slo", raw, Handle())
    assert err.value.plugin == "slo" and err.value.field == field
    assert "plugin 'slo' (type: predicted-latency-producer)" in str(err.value)


def test_config_creates_and_orders_the_prefix_producer_it_reads() -> None:
    d, plugin, _ = director()
    types = [p.type_name for p in d.scheduler.producers]
    assert types.index("approx-prefix-cache-producer") < types.index("predicted-latency-producer")
    prefix = d.pipeline.handle.first_of_type("approx-prefix-cache-producer")
    assert isinstance(prefix, ApproxPrefixCacheProducer)
    assert plugin in d.pipeline.pre_request and plugin in d.pipeline.response_started
    assert plugin in d.pipeline.response_complete


# -- validity and headroom (Produce) --------------------------------------------------------------------------------

CASES = [
    # id, params, headers, endpoint role, running (id, TPOT SLO) on the endpoint, prediction, expected fields
    ("non-streaming: TPOT not judged", {}, {TTFT: "100", TPOT: "10"}, None, [], (80, 50), (True, True, 20, 0)),
    ("TTFT over its SLO", {}, {TTFT: "100"}, None, [], (120, 5), (False, True, -20, 0)),
    ("no TTFT header: SLO 0, never valid", {}, {}, None, [], (80, 5), (False, True, -80, 0)),
    ("deprecated x-slo-* headers", {}, {"x-slo-ttft-ms": "90"}, None, [], (80, 5), (True, True, 10, 0)),
    ("a header that is no number is 0", {}, {TTFT: "fast"}, None, [], (80, 5), (False, True, -80, 0)),
    ("streaming: TPOT within its SLO", {"streamingMode": True}, {TTFT: "100", TPOT: "10"}, None, [], (80, 8),
     (True, True, 20, 2)),
    ("streaming: TPOT over its SLO", {"streamingMode": True}, {TTFT: "100", TPOT: "10"}, None, [], (80, 12),
     (True, False, 20, -2)),
    ("streaming: no TPOT header", {"streamingMode": True}, {TTFT: "100"}, None, [], (80, 1), (True, False, 20, -1)),
    ("streaming: buffer factor", {"streamingMode": True, "sloBufferFactor": 1.5}, {TTFT: "100", TPOT: "10"}, None,
     [], (80, 12), (True, True, 20, 3)),
    ("streaming: prefill endpoint not judged", {"streamingMode": True, "endpointRoleLabel": ROLE_LABEL},
     {TTFT: "100", TPOT: "10"}, "prefill", [], (80, 50), (True, True, 20, 0)),
    ("streaming: decode endpoint judged", {"streamingMode": True, "endpointRoleLabel": ROLE_LABEL},
     {TTFT: "100", TPOT: "10"}, "decode", [], (80, 50), (True, False, 20, -40)),
    ("streaming: no role label set, prefill judged", {"streamingMode": True}, {TTFT: "100", TPOT: "10"}, "prefill",
     [], (80, 50), (True, False, 20, -40)),
    ("streaming: a running request's tighter SLO caps", {"streamingMode": True}, {TTFT: "100", TPOT: "10"}, None,
     [("r1", 6.0), ("r2", 30.0)], (80, 8), (True, False, 20, -2)),
    ("streaming: the cap is buffered too", {"streamingMode": True, "sloBufferFactor": 2},
     {TTFT: "100", TPOT: "10"}, None, [("r1", 6.0)], (80, 8), (True, True, 20, 4)),
    ("streaming: a running request without SLO turns the cap off", {"streamingMode": True},
     {TTFT: "100", TPOT: "10"}, None, [("r1", 6.0), ("r2", 0.0)], (80, 8), (True, True, 20, 2)),
    ("non-streaming: running SLOs ignored", {}, {TTFT: "100", TPOT: "10"}, None, [("r1", 1.0)], (80, 8),
     (True, True, 20, 0)),
]


@pytest.mark.parametrize("params,headers,role,running,pred,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_validity_and_headroom(params: dict[str, Any], headers: dict[str, str], role: str | None,
                               running: list[tuple[str, float]], pred: tuple[float, float],
                               expected: tuple[bool, bool, float, float]) -> None:
    plugin = make(PredictedLatencyProducer, params, predictor=FixedPredictor(pred))
    endpoint = ep("a", role=role)
    for rid, slo in running:
        plugin.running.add("a", rid, slo)
    cycle = CycleState()
    plugin.produce(cycle, req(headers=headers), [endpoint])
    info = predictions_of(cycle)["a"]
    assert info == LatencyPredictionInfo(*expected, ttft=pred[0], tpot=pred[1], dispatched_request_count=len(running))
    assert info.valid == (expected[0] and expected[1])


@pytest.mark.parametrize("params,ready,stored", [
    ({}, (False, False), False), ({}, (True, False), True), ({"streamingMode": True}, (True, False), False),
    ({"streamingMode": True}, (True, True), True), ({"predictInProduce": False}, (True, True), False),
], ids=["ttft-not-ready", "non-streaming-needs-ttft-only", "streaming-needs-tpot", "streaming-ready",
        "predictInProduce-false"])
def test_predictions_stored_only_when_the_predictor_is_ready(params: dict[str, Any], ready: tuple[bool, bool],
                                                             stored: bool) -> None:
    plugin = make(PredictedLatencyProducer, params,
                  predictor=FixedPredictor((10, 1), ttft_ready=ready[0], tpot_ready=ready[1]))
    cycle = CycleState()
    plugin.produce(cycle, req(headers={TTFT: "100"}), [ep("a"), ep("b")])
    assert (LATENCY_PREDICTIONS_KEY in cycle) == stored
    assert set(predictions_of(cycle)) == ({"a", "b"} if stored else set())


async def test_features_come_from_metrics_inflight_counts_prefix_and_role() -> None:
    d, plugin, _ = director(f"{{endpointRoleLabel: {ROLE_LABEL}}}", "decode", None)
    plugin.predictor = fixed = FixedPredictor((10, 1))
    prompt = "shared prefix " * 40
    ctx = await d.route(req(prompt, headers=to(0)))  # indexes the prompt's blocks on e0
    e0, e1 = d.datastore.get("e0"), d.datastore.get("e1")
    assert e0 is not None and e1 is not None
    e1.metrics = Metrics(update_time=1e12, kv_usage=0.75, waiting=4)
    request = req(prompt, headers=to(1))
    cycle = d.scheduler.prepare(request, [e0, e1])
    f0, f1 = fixed.seen
    assert (f0.prefix_cache_score, f0.num_request_running, f0.prefill_tokens_in_flight, f0.pod_type) == \
        (1.0, 1, e0.inflight_tokens, "decode")
    assert f0.prefill_tokens_in_flight > 0 and f0.input_token_length == request.input_tokens
    assert (f1.prefix_cache_score, f1.num_request_running, f1.kv_cache_percentage, f1.num_request_waiting,
            f1.pod_type) == (0.0, 0, 0.75, 4, "")
    assert predictions_of(cycle)["e0"].dispatched_request_count == 1  # ctx still running there
    d.response_complete(ctx, ResponseInfo())


# -- request control (PreRequest, ResponseStarted, ResponseComplete) ---------------------------------------------


async def test_non_streaming_mode_trains_the_whole_request_as_ttft_and_releases_state() -> None:
    d, plugin, clock = director()
    plugin.predictor = fixed = FixedPredictor((40, 3))
    ctx = await d.route(req(headers=to(0, **{TTFT: "500"})))
    rid = ctx.request.request_id
    assert plugin.tracked() == [rid] and plugin.running.count("e0") == 1
    clock.now += 0.25
    d.response_started(ctx)
    assert fixed.samples == []
    clock.now += 0.5
    d.response_complete(ctx, ResponseInfo(completion_tokens=10, streamed=True))
    [sample] = fixed.samples
    assert (sample.actual_ttft, sample.actual_tpot) == (pytest.approx(750.0), 0.0)
    assert (sample.features.kv_cache_percentage, sample.features.num_request_waiting) == (0.25, 1)
    assert plugin.tracked() == [] and plugin.running.count("e0") == 0


async def test_streaming_mode_trains_ttft_at_first_byte_and_average_tpot_at_the_end() -> None:
    d, plugin, clock = director("{streamingMode: true}")
    plugin.predictor = fixed = FixedPredictor((40, 3))
    ctx = await d.route(req(headers=to(1, **{TPOT: "20"})))
    clock.now += 0.2
    d.response_started(ctx)
    [ttft] = fixed.samples
    assert ttft.actual_ttft == pytest.approx(200.0) and ttft.actual_tpot == 0.0
    clock.now += 0.9
    d.response_complete(ctx, ResponseInfo(completion_tokens=10, streamed=True))
    tpot = fixed.samples[1]
    assert tpot.actual_tpot == pytest.approx(100.0) and tpot.actual_ttft == 0.0  # 900 ms over 9 tokens
    assert plugin.tracked() == [] and plugin.running.count("e1") == 0


async def test_streaming_mode_counts_chunks_as_tokens_when_the_answer_has_no_usage() -> None:
    """A client that did not ask for usage still trains TPOT: the Director counts the streamed chunks (as the
    reference counts them as tokens)."""
    d, plugin, clock = director("{streamingMode: true}")
    plugin.predictor = fixed = FixedPredictor((40, 3))
    ctx = await d.route(req(headers=to(1)))
    d.response_started(ctx)
    for _ in range(5):  # five chunks after the first
        clock.now += 0.2
        d.stream_chunk(ctx)
    info = ResponseInfo(completion_tokens=None, streamed=True)
    d.response_complete(ctx, info)
    assert info.stream_chunks == 6
    assert fixed.samples[1].actual_tpot == pytest.approx(200.0)  # 1000 ms over 5 gaps


@pytest.mark.parametrize("info", [ResponseInfo(completion_tokens=10, streamed=False),
                                  ResponseInfo(completion_tokens=1, streamed=True),
                                  ResponseInfo(completion_tokens=None, streamed=True)],
                         ids=["not-streamed", "one-token", "no-usage"])
async def test_streaming_mode_without_two_streamed_tokens_gives_no_tpot(info: ResponseInfo) -> None:
    d, plugin, clock = director("{streamingMode: true}")
    plugin.predictor = fixed = FixedPredictor((40, 3))
    ctx = await d.route(req(headers=to(0)))
    d.response_started(ctx)
    clock.now += 1
    d.response_complete(ctx, info)
    assert [s.actual_tpot for s in fixed.samples] == [0.0]  # the TTFT sample only
    assert plugin.tracked() == []


async def test_an_error_releases_state_without_training() -> None:
    d, plugin, clock = director()
    plugin.predictor = fixed = FixedPredictor((40, 3))
    ctx = await d.route(req(headers=to(0)))
    clock.now += 1
    d.response_complete(ctx, ResponseInfo(status=500, error=True))
    assert fixed.samples == [] and plugin.tracked() == [] and plugin.running.count("e0") == 0


async def test_an_answer_from_a_fallback_endpoint_trains_nothing() -> None:
    d, plugin, clock = director()
    plugin.predictor = fixed = FixedPredictor((40, 3))
    ctx = await d.route(req(headers=to(0)))
    fallback = d.datastore.get("e1")
    assert fallback is not None
    d.retarget(ctx, fallback)
    clock.now += 1
    d.response_complete(ctx, ResponseInfo())
    assert fixed.samples == [] and plugin.tracked() == [] and plugin.running.count("e0") == 0


async def test_state_expires_after_context_ttl_and_the_first_byte_renews_it() -> None:
    d, plugin, clock = director("{contextTTL: 10s}")
    plugin.predictor = fixed = FixedPredictor((40, 3))
    lost = await d.route(req(headers=to(0)))
    clock.now += 5
    kept = await d.route(req(headers=to(0)))
    clock.now += 4
    d.response_started(kept)          # renews kept's TTL: 10 s from now
    clock.now += 2                    # lost is 11 s old
    fresh = await d.route(req(headers=to(1)))
    assert plugin.tracked() == [kept.request.request_id, fresh.request.request_id]
    assert plugin.running.count("e0") == 1
    d.response_complete(lost, ResponseInfo())  # its state is gone: nothing to learn from
    assert fixed.samples == []
    for ctx in (kept, fresh):
        d.response_complete(ctx, ResponseInfo())
    assert len(fixed.samples) == 2 and plugin.tracked() == []


async def test_context_ttl_zero_keeps_state_until_the_end() -> None:
    d, plugin, clock = director("{contextTTL: 0}")
    ctx = await d.route(req(headers=to(0)))
    clock.now += 1e6
    await d.route(req(headers=to(1)))
    assert ctx.request.request_id in plugin.tracked()


def test_disaggregation_trains_ttft_on_the_prefill_endpoint_and_tpot_on_the_decode_one() -> None:
    plugin = make(PredictedLatencyProducer, {"streamingMode": True, "endpointRoleLabel": ROLE_LABEL},
                  predictor=(fixed := FixedPredictor((40, 3))), clock=(clock := Clock()))
    prefill, decode = ep("p", role="prefill", kv=0.9), ep("d", role="decode", kv=0.1)
    request = req(headers={TPOT: "25"})
    result = SchedulingResult({"decode": ProfileRunResult([decode]), "prefill": ProfileRunResult([prefill])},
                              primary_profile="decode")
    plugin.pre_request(request, result)
    assert plugin.running.count("d") == 1 and plugin.running.count("p") == 0
    assert plugin.running.min_slo("d") == 25.0
    clock.now += 0.1
    plugin.response_started(request, decode)
    clock.now += 0.4
    plugin.response_complete(request, decode, ResponseInfo(completion_tokens=5, streamed=True))
    ttft, tpot = fixed.samples
    assert (ttft.features.kv_cache_percentage, ttft.features.pod_type, ttft.actual_ttft) == \
        (0.9, "prefill", pytest.approx(100.0))
    assert (tpot.features.kv_cache_percentage, tpot.features.pod_type, tpot.actual_tpot) == \
        (0.1, "decode", pytest.approx(100.0))


async def test_the_in_process_predictor_starts_predicting_after_its_warm_up() -> None:
    d, plugin, clock = director("{predictor: {minSamples: 4, objective: mean}}")
    assert isinstance(plugin.predictor, InProcessPredictor)
    e0, e1 = d.datastore.endpoints()
    for i in range(4):
        assert LATENCY_PREDICTIONS_KEY not in d.scheduler.prepare(req(), [e0, e1])
        ctx = await d.route(req(headers=to(i % 2)))
        clock.now += 0.1 + 0.05 * i
        d.response_complete(ctx, ResponseInfo())
    assert set(predictions_of(d.scheduler.prepare(req(), [e0, e1]))) == {"e0", "e1"}


# -- metrics ----------------------------------------------------------------------------------------------------


async def test_metrics_record_latencies_predictions_and_violations() -> None:
    d, plugin, clock = director("{streamingMode: true}")
    plugin.predictor = FixedPredictor((150, 12))
    registry_ = CollectorRegistry()
    instrument_pipeline(d.pipeline, EppMetrics(registry_))
    assert isinstance(plugin.metrics, LatencyMetrics)
    ctx = await d.route(req(headers=to(0, **{TTFT: "100", TPOT: "50"})))
    clock.now += 0.2                  # TTFT 200 ms > 100 ms
    d.response_started(ctx)
    clock.now += 0.3                  # TPOT 300 ms / 3 = 100 ms > 50 ms
    d.response_complete(ctx, ResponseInfo(completion_tokens=4, streamed=True))
    plugin_labels = {"plugin_name": "predicted-latency-producer", "plugin_type": "predicted-latency-producer"}
    model = {"model_name": "m", "target_model_name": "m"}

    def value(name: str, **labels: str) -> float | None:
        return registry_.get_sample_value(name, labels)

    for kind in ("ttft", "tpot"):
        assert value("llm_d_epp_request_slo_violation_total", **plugin_labels, **model, type=kind) == 1
        assert value("inference_objective_request_slo_violation_total", **model, type=kind) == 1
    assert value("inference_objective_request_ttft_seconds_sum", **model) == pytest.approx(0.2)
    assert value("llm_d_epp_request_predicted_ttft_seconds_sum", **plugin_labels, **model) == \
        pytest.approx(0.15)
    assert value("llm_d_epp_request_tpot_seconds_sum", **plugin_labels, **model) == pytest.approx(0.1)
    assert value("inference_objective_request_tpot_seconds_count", **model) == 1
    assert value("inference_objective_request_predicted_tpot_seconds_sum", **model) == pytest.approx(0.012)


async def test_no_violation_without_slo_and_no_predicted_sample_without_prediction() -> None:
    d, plugin, clock = director()
    plugin.predictor = FixedPredictor((150, 12), ttft_ready=False)
    registry_ = CollectorRegistry()
    instrument_pipeline(d.pipeline, EppMetrics(registry_))
    ctx = await d.route(req(headers=to(0)))
    clock.now += 0.2
    d.response_complete(ctx, ResponseInfo())
    model = {"model_name": "m", "target_model_name": "m"}
    assert registry_.get_sample_value("inference_objective_request_slo_violation_total",
                                      {**model, "type": "ttft"}) is None
    assert registry_.get_sample_value("inference_objective_request_predicted_ttft_seconds_count", model) is None
    assert registry_.get_sample_value("inference_objective_request_ttft_seconds_count", model) == 1


def test_two_producers_share_one_set_of_metric_families() -> None:
    text = HEAD + "plugins:\n- {type: predicted-latency-producer, name: a}\n- {type: predicted-latency-producer, " \
                  "name: b}\n"
    pipeline = build_pipeline(*load_raw(text, "<test>"), registry())
    instrument_pipeline(pipeline, EppMetrics(CollectorRegistry()))
    a, b = (pipeline.handle.plugin(n) for n in "ab")
    assert isinstance(a, PredictedLatencyProducer) and isinstance(b, PredictedLatencyProducer)
    assert a.metrics is not None and a.metrics is b.metrics
