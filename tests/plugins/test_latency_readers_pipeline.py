"""The three latency readers in a loaded config and on the request path: their docstring examples load and bring the
producer they consume (a stand-in for ``predicted-latency-producer``), a named producer is checked, bad values are
errors naming plugin, field and line, and through the real Director the admitter's denial is the reference's 500
while slo-headroom-tier-filter + latency-scorer route to the endpoint with headroom."""

from __future__ import annotations

import textwrap

import orjson
import pytest

from epp.config.loader import Pipeline, build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.errors import ConfigError, ErrorCode, InternalError
from epp.framework.endpoint import EndpointSpec, Metrics
from epp.framework.registry import Registry
from epp.latency import PRODUCER_TYPE, LatencyPredictionInfo, predictions_of
from epp.plugins.filters.slo_headroom_tier import SloHeadroomTierFilter
from epp.plugins.producers.approx_prefix_cache import PRODUCER_TYPE as PREFIX_PRODUCER_TYPE
from epp.plugins.requestcontrol.latency_slo_admitter import LatencySloAdmitter
from epp.plugins.scorers.latency import LatencyScorer
from epp.scheduling.director import Director

from .latency import info, latency_registry, stand_in


@pytest.fixture(scope="module")
def registry() -> Registry:
    return latency_registry()


def example(cls: type) -> str:
    """The plugin entry of ``cls``'s module docstring YAML example."""
    import importlib

    doc = importlib.import_module(cls.__module__).__doc__ or ""
    return textwrap.dedent(doc.split("YAML::", 1)[1]).strip() + "\n"


@pytest.mark.parametrize("cls", [LatencyScorer, SloHeadroomTierFilter, LatencySloAdmitter],
                         ids=lambda c: c.type_name)
def test_the_docstring_example_loads_with_the_producer_it_consumes(registry: Registry, cls: type) -> None:
    text = "plugins:\n" + example(cls) + "- type: max-score-picker\n"
    pipeline = build_pipeline(*load_raw(text), registry)
    plugin = pipeline.handle.first_of_type(cls.type_name)
    assert isinstance(plugin, cls)
    assert stand_in(pipeline.handle).name == PRODUCER_TYPE  # created automatically
    assert stand_in(pipeline.handle) in pipeline.scheduler.producers
    has_prefix = pipeline.handle.first_of_type(PREFIX_PRODUCER_TYPE) is not None
    assert has_prefix is (cls is LatencyScorer)
    if cls is LatencySloAdmitter:
        assert pipeline.admitters == [plugin]


REFERENCE_SLO_CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
  parameters:
    insecureSkipVerify: true
    path: /metrics
    scheme: http
- type: core-metrics-extractor
- type: predicted-latency-producer
  parameters:
    streamingMode: true
- type: prefix-cache-affinity-filter
  name: strict-affinity-filter
  parameters:
    affinityThreshold: 0.99
- type: prefix-cache-affinity-filter
  name: loose-affinity-filter
  parameters:
    affinityThreshold: 0.8
- type: latency-scorer
- type: weighted-random-picker
- type: slo-headroom-tier-filter
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: strict-affinity-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
"""
"""llm-d-router's well-known ``predicted-latency-slo`` config (its runner tests load it), verbatim."""


def test_the_reference_predicted_latency_slo_config_loads(registry: Registry) -> None:
    pipeline = build_pipeline(*load_raw(REFERENCE_SLO_CONFIG), registry)
    profile = pipeline.scheduler.profiles["default"]
    assert [f.name for f in profile.filters] == ["strict-affinity-filter", "slo-headroom-tier-filter",
                                                  "loose-affinity-filter"]
    assert [type(w.scorer) for w in profile.scorers] == [LatencyScorer]
    assert [a.type_name for a in pipeline.admitters] == ["latency-slo-admitter"]
    assert [p.type_name for p in pipeline.handle.plugins()].count(PRODUCER_TYPE) == 1  # the declared one


NAMED = """\
plugins:
- {type: predicted-latency-producer, name: lp}
- {type: latency-slo-admitter, parameters: {latencyPredictionInfoProducerName: %(name)s}}
- {type: slo-headroom-tier-filter, parameters: {latencyPredictionInfoProducerName: lp}}
- {type: latency-scorer, parameters: {latencyPredictionInfoProducerName: lp}}
- type: max-score-picker
"""


def test_readers_may_name_the_producer(registry: Registry) -> None:
    pipeline = build_pipeline(*load_raw(NAMED % {"name": "lp"}), registry)
    producers = [p for p in pipeline.handle.plugins() if p.type_name == PRODUCER_TYPE]
    assert [p.name for p in producers] == ["lp"]  # no second one is created


def test_naming_a_producer_that_is_not_configured_is_an_error(registry: Registry) -> None:
    with pytest.raises(ConfigError, match="names plugin 'nowhere', which is not configured") as err:
        build_pipeline(*load_raw(NAMED % {"name": "nowhere"}, "c.yaml"), registry)
    assert err.value.field == "latencyPredictionInfoProducerName" and err.value.plugin == "latency-slo-admitter"


def test_naming_the_prefix_producer_still_creates_the_latency_producer(registry: Registry) -> None:
    text = ("plugins:\n- {type: approx-prefix-cache-producer, name: px}\n"
            "- {type: latency-scorer, parameters: {prefixMatchInfoProducerName: px}}\n- type: max-score-picker\n")
    pipeline = build_pipeline(*load_raw(text), registry)
    assert pipeline.handle.first_of_type(PRODUCER_TYPE) is not None


@pytest.mark.parametrize("kind, entry, field, line", [
    ("slo-headroom-tier-filter", "{type: slo-headroom-tier-filter, parameters: {epsilonExploreNeg: 2}}",
     "epsilonExploreNeg", 2),
    ("latency-scorer", "type: latency-scorer\n  parameters:\n    headroomSelectionStrategy: [least]",
     "headroomSelectionStrategy", 4),
    ("latency-scorer", "type: latency-scorer\n  parameters: {tpotWeight: fast}", "tpotWeight", 3),
    ("latency-slo-admitter", "{type: latency-slo-admitter, parameters: {sloHeaders: x}}", "sloHeaders", 2),
])
def test_bad_values_name_plugin_field_and_line(registry: Registry, kind: str, entry: str, field: str,
                                               line: int) -> None:
    with pytest.raises(ConfigError) as err:
        build_pipeline(*load_raw(f"plugins:\n- {entry}\n- type: max-score-picker\n", "c.yaml"), registry)
    assert err.value.field == field and err.value.line == line
    assert f"plugin '{kind}' (type: {kind})" in str(err.value)


# -- through the Director -------------------------------------------------------------------------------------------

ROUTING = """\
plugins:
- type: latency-slo-admitter
- {type: slo-headroom-tier-filter, parameters: {epsilonExploreNeg: 0}}
- {type: latency-scorer, parameters: {headroomSelectionStrategy: %s}}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: latency-scorer
  - pluginRef: max-score-picker
"""
WARM_BUSY = Metrics(kv_usage=0.5, running=4, update_time=1.0)


def director(registry: Registry, predictions: dict[str, LatencyPredictionInfo], strategy: str = "least",
             metrics: dict[str, Metrics] | None = None) -> Director:
    """A Director over endpoints a, b, c (warm and busy unless ``metrics`` says) whose producer predicts
    ``predictions``; InferenceObjective ``batch`` has priority -1."""
    pipeline: Pipeline = build_pipeline(*load_raw(ROUTING % strategy), registry)
    stand_in(pipeline.handle).table = dict(predictions)
    store = Datastore()
    for i, name in enumerate("abc"):
        store.upsert(EndpointSpec(name=name, address=f"10.0.0.{i + 1}", port=8000)).metrics = \
            (metrics or {}).get(name, WARM_BUSY)
    store.objectives.set("batch", -1)
    return Director(pipeline, store)


def parse(d: Director, objective: str | None = "batch", slo: str | None = "100") -> object:
    headers = {"x-llm-d-router-inference-objective": objective} if objective else {}
    if slo is not None:
        headers["x-llm-d-router-slo-ttft-ms"] = slo
    return d.parse("/v1/completions", orjson.dumps({"model": "m", "prompt": "hello"}), headers)


MISSING_ALL = {"a": info(-50, -5, 2), "b": info(-10, -1, 3), "c": info(-30, 2, 1)}


async def test_a_sheddable_request_no_endpoint_can_serve_gets_the_reference_500(registry: Registry) -> None:
    d = director(registry, MISSING_ALL)
    request = parse(d)
    assert request.sheddable  # type: ignore[attr-defined]
    with pytest.raises(InternalError) as err:
        await d.route(request)  # type: ignore[arg-type]
    assert err.value.status == 500 and err.value.code is ErrorCode.INTERNAL
    assert err.value.message == "request cannot be admitted: no valid endpoint available to serve the request"
    assert all(e.inflight_requests == 0 for e in d.datastore.endpoints())


@pytest.mark.parametrize("objective, slo, metrics", [
    (None, "100", None),
    ("batch", None, None),
    ("batch", "100", {"c": Metrics(kv_usage=0.01, running=4, update_time=1.0)}),
    ("batch", "100", {"a": Metrics(kv_usage=0.5, running=0, update_time=1.0)}),
], ids=["not-sheddable", "no-slo", "a-cold-endpoint", "an-idle-endpoint"])
async def test_otherwise_it_is_admitted_and_routed_to_the_least_deficit(registry: Registry, objective: str | None,
                                                                        slo: str | None, metrics: dict | None) -> None:
    d = director(registry, MISSING_ALL, metrics=metrics)
    ctx = await d.route(parse(d, objective, slo))  # type: ignore[arg-type]
    assert ctx.target.name == "c"  # busy, all negative: c misses only its TPOT SLO (the least severe bucket)


@pytest.mark.parametrize("strategy, target", [("least", "c"), ("most", "b")])
async def test_the_filter_and_scorer_route_to_an_endpoint_with_headroom(registry: Registry, strategy: str,
                                                                      target: str) -> None:
    predictions = {"a": info(-5, 1, 0), "b": info(60, 4, 3), "c": info(15, 2, 3)}
    d = director(registry, predictions, strategy)
    ctx = await d.route(parse(d))  # type: ignore[arg-type]
    assert ctx.target.name == target  # a (idle, but predicted to miss) is filtered out
    assert set(predictions_of(ctx.result.cycle)) == {"a", "b", "c"}  # the cycle the producer filled


async def test_without_predictions_everything_is_admitted_and_scored_on_load(registry: Registry) -> None:
    metrics = {"a": Metrics(kv_usage=0.9, running=4, waiting=3, update_time=1.0),
               "b": Metrics(kv_usage=0.2, running=4, update_time=1.0)}
    d = director(registry, {}, metrics=metrics)
    ctx = await d.route(parse(d))  # type: ignore[arg-type]
    assert ctx.target.name == "b"  # the composite fallback: most free KV, no queue
