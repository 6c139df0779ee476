"""EPP's own Prometheus metrics: names and labels as the reference (each legacy family and its
``llm_d_epp_*`` replacement), pool gauges from the Datastore, /metrics app."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epp.framework.endpoint import EndpointSpec, Metrics
from epp.framework.plugins import ResponseInfo
from epp.metrics.families import EppMetrics, PoolCollector, make_metrics_app
from epp.runtime.app import EppApp, ServeOptions
from epp.scheduling.scheduler import PluginTimer
from epp_sim import SimConfig, SimPool

from ..conftest import eventually
from .fake_kube import FakeKube
from .llmd_reference import RENAMED, SPLIT, check_llmd_twins

NTPOT = "normalized_time_per_output_token_seconds"


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(registry: CollectorRegistry, metric: str, **labels: str) -> float:
    return samples(registry)[(metric, frozenset(labels.items()))]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry) -> EppMetrics:
    return EppMetrics(registry, namespace="ns", commit="abc123", build_ref="v9")


def test_request_path_families(metrics, registry, datastore):
    ep = datastore.upsert(EndpointSpec("pod-a-rank-0", "10.0.0.1", 8000))
    metrics.record_request("m", "t", 0)
    metrics.record_request("m", "t", -1)
    metrics.record_error("m", "t", "ResourceExhausted")
    metrics.record_error("m", "t", "")
    metrics.record_duration("m", "t", 0.5)
    metrics.record_duration("m", "t", -1.0)  # clock skew: dropped
    metrics.record_tokens("m", "t", 100, 20, 64)
    metrics.record_tokens("m", "t", None, None, None)
    metrics.record_sizes("m", "t", 2048, None)
    metrics.record_ntpot("m", "t", 1.0, 20)
    metrics.running_inc("m")
    metrics.running_inc("m")
    metrics.running_dec("m")
    metrics.observe_ttft("m", "t", 0.12)
    metrics.observe_itl("m", "t", 0.02)
    metrics.observe_itl("m", "t", 0.03)
    metrics.scheduler_e2e(0.0003)
    metrics.scheduler_attempt("success", "t", ep)
    metrics.scheduler_attempt("failure", "t", None)
    timer: PluginTimer = metrics.plugin_duration
    timer("Scorer", "queue-scorer", "q", 0.00005)
    M = dict(model_name="m", target_model_name="t")
    assert value(registry, "inference_objective_request_total", priority="0", **M) == 1
    assert value(registry, "inference_objective_request_total", priority="-1", **M) == 1
    assert value(registry, "inference_objective_request_error_total", error_code="ResourceExhausted", **M) == 1
    assert value(registry, "inference_objective_request_duration_seconds_count", **M) == 1
    assert value(registry, "inference_objective_input_tokens_sum", **M) == 100
    assert value(registry, "inference_objective_output_tokens_sum", **M) == 20
    assert value(registry, "inference_objective_prompt_cached_tokens_sum", **M) == 64
    assert value(registry, "inference_objective_request_sizes_sum", **M) == 2048
    assert value(registry, "inference_objective_normalized_time_per_output_token_seconds_sum", **M) == 0.05
    assert value(registry, "inference_objective_running_requests", model_name="m") == 1
    assert value(registry, "inference_extension_scheduler_e2e_duration_seconds_count") == 1
    assert value(registry, "inference_extension_scheduler_attempts_total", status="success", target_model_name="t",
                 pod_name="pod-a-rank-0", namespace="ns", port="8000") == 1
    assert value(registry, "inference_extension_scheduler_attempts_total", status="failure", target_model_name="t",
                 pod_name="", namespace="", port="") == 1
    assert value(registry, "inference_extension_plugin_duration_seconds_count", extension_point="Scorer",
                 plugin_type="queue-scorer", plugin_name="q") == 1
    assert value(registry, "inference_extension_info", commit="abc123", build_ref="v9") == 1
    assert value(registry, "llm_d_epp_info", commit="abc123", build_ref="v9") == 1
    assert value(registry, "llm_d_epp_scheduler_attempts_total", status="success", target_model_name="t",
                 endpoint_name="pod-a-rank-0", namespace="ns", port="8000") == 1
    F = dict(fairness_id="", priority="0", **M)
    assert value(registry, "llm_d_epp_request_ntpot_seconds_sum", **F) == 0.05
    assert value(registry, "llm_d_epp_request_total", **{**F, "priority": "-1"}) == 1
    assert value(registry, "llm_d_epp_request_error_total", error_code="ResourceExhausted", **F) == 1
    assert value(registry, "llm_d_epp_request_size_bytes_sum", **F) == 2048
    assert value(registry, "llm_d_epp_request_input_tokens_sum", **F) == 100
    assert value(registry, "llm_d_epp_request_cached_tokens_sum", **F) == 64
    assert value(registry, "llm_d_epp_request_running", fairness_id="", priority="0", model_name="m",
                 target_model_name="") == 1
    # EPP-observed TTFT and ITL: under the new names only, as the reference
    assert value(registry, "llm_d_epp_request_ttft_seconds_count", streaming="true", **F) == 1
    assert value(registry, "llm_d_epp_request_streaming_itl_seconds_count", **F) == 2
    assert not any(n.startswith(("inference_objective_request_ttft", "inference_objective_request_itl"))
                   for n, _ in samples(registry))
    checked = check_llmd_twins(generate_latest(registry).decode())
    assert {"inference_objective_request", "inference_objective_running_requests",
            "inference_extension_scheduler_attempts", "inference_objective_" + NTPOT} <= checked


def test_prefix_indexer(metrics, registry):
    size = [10]
    metrics.set_prefix_indexer_size(lambda: size[0])
    metrics.observe_prefix_match(30, 60)
    metrics.observe_prefix_match(0, 0)
    size[0] = 25
    assert value(registry, "inference_extension_prefix_indexer_size") == 25
    assert value(registry, "inference_extension_prefix_indexer_hit_ratio_count") == 1
    assert value(registry, "inference_extension_prefix_indexer_hit_ratio_sum") == 0.5
    assert value(registry, "inference_extension_prefix_indexer_hit_bytes_count") == 2


def test_pool_gauges_are_computed_from_the_datastore(metrics, registry, datastore):
    now = time.monotonic()
    datastore.replace_all([EndpointSpec(n, f"10.0.0.{i}", 8000) for i, n in enumerate("abc")])
    a, b, c = (datastore.get(n) for n in "abc")
    a.metrics = Metrics(waiting=4, running=2, kv_usage=0.2, update_time=now)
    b.metrics = Metrics(waiting=2, running=6, kv_usage=0.6, update_time=now)
    c.metrics = Metrics(waiting=100, running=100, kv_usage=1.0, update_time=now - 60)  # stale: not averaged
    metrics.attach_pool(datastore, staleness=2.0)
    pool = dict(name="test-pool")
    assert value(registry, "inference_pool_ready_pods", **pool) == 2  # fresh metrics only, as the reference
    assert value(registry, "llm_d_epp_ready_endpoints", **pool) == 2
    assert value(registry, "llm_d_epp_average_queue_size", **pool) == 3
    assert value(registry, "llm_d_epp_per_endpoint_queue_size", model_server_endpoint="b", **pool) == 2
    assert check_llmd_twins(generate_latest(registry).decode()) >= {
        "inference_pool_ready_pods", "inference_pool_average_kv_cache_utilization", "inference_pool_average_queue_size",
        "inference_pool_average_running_requests", "inference_pool_per_pod_queue_size"}
    assert value(registry, "inference_pool_average_kv_cache_utilization", **pool) == pytest.approx(0.4)
    assert value(registry, "inference_pool_average_queue_size", **pool) == 3
    assert value(registry, "inference_pool_average_running_requests", **pool) == 4
    assert value(registry, "inference_pool_per_pod_queue_size", model_server_pod="a", **pool) == 4
    # the spread over the fresh endpoints (a, b), sample deviation as the reference: sqrt(((4-3)^2 + (2-3)^2) / 1)
    assert value(registry, "llm_d_epp_std_dev_queue_size", **pool) == pytest.approx(1.41)
    assert value(registry, "llm_d_epp_std_dev_running_requests", **pool) == pytest.approx(2.83)
    assert value(registry, "llm_d_epp_std_dev_kv_cache_utilization", **pool) == pytest.approx(0.28)
    assert ("inference_pool_per_pod_queue_size", frozenset({("name", "test-pool"), ("model_server_pod", "c")})) \
        not in samples(registry)
    datastore.remove("a")  # no stale series left behind
    assert ("inference_pool_per_pod_queue_size", frozenset({("name", "test-pool"), ("model_server_pod", "a")})) \
        not in samples(registry)
    metrics.attach_pool(datastore)  # re-attaching replaces, never duplicates
    assert value(registry, "inference_pool_ready_pods", **pool) == 1
    c.metrics = Metrics(update_time=time.monotonic())  # scraped again: ready again
    b.metrics = Metrics()  # never scraped: not ready
    assert value(registry, "inference_pool_ready_pods", **pool) == 1
    assert ("inference_pool_per_pod_queue_size", frozenset({("name", "test-pool"), ("model_server_pod", "c")})) \
        in samples(registry)


def test_empty_pool_reports_zeros(registry, datastore):
    registry.register(PoolCollector(datastore))
    assert value(registry, "inference_pool_ready_pods", name="test-pool") == 0
    assert value(registry, "inference_pool_average_queue_size", name="test-pool") == 0
    assert value(registry, "llm_d_epp_std_dev_queue_size", name="test-pool") == 0


def test_pool_summary_rounds_to_two_decimals_and_one_endpoint_has_no_spread(registry, datastore):
    datastore.replace_all([EndpointSpec(n, f"10.0.0.{i}", 8000) for i, n in enumerate("abc")])
    now = time.monotonic()
    for name, kv in zip("abc", (0.1, 0.2, 0.25)):
        datastore.get(name).metrics = Metrics(waiting=1, running=1, kv_usage=kv, update_time=now)
    registry.register(PoolCollector(datastore))
    pool = dict(name="test-pool")
    assert value(registry, "llm_d_epp_average_kv_cache_utilization", **pool) == 0.18  # 0.18333…, as round2
    assert value(registry, "llm_d_epp_std_dev_kv_cache_utilization", **pool) == 0.08  # 0.0764…
    assert value(registry, "llm_d_epp_std_dev_queue_size", **pool) == 0
    datastore.remove("b")
    datastore.remove("c")
    assert value(registry, "llm_d_epp_std_dev_kv_cache_utilization", **pool) == 0  # n - 1 = 0 divides by 1


@pytest.mark.parametrize("info", [
    ResponseInfo(status=200, prompt_tokens=300, completion_tokens=16, cached_tokens=64),
    ResponseInfo(status=200, prompt_tokens=300, completion_tokens=None, cached_tokens=None),
    ResponseInfo(status=200, prompt_tokens=None, completion_tokens=5, cached_tokens=0),
    ResponseInfo(status=502, error=True, prompt_tokens=10, completion_tokens=2),
], ids=["usage", "no-completion", "no-prompt", "error"])
@pytest.mark.parametrize("seconds", [0.8, 0.0])
def test_request_path_calls_record_what_the_fine_grained_methods_record(info, seconds, datastore):
    """``scheduled`` and ``completed`` (the Director's calls) equal the per-family methods they stand for, and
    a series shows up only once something was recorded into it."""
    ep = datastore.upsert(EndpointSpec("pod-a", "10.0.0.1", 8000))
    bundled, fine = CollectorRegistry(), CollectorRegistry()
    m1, m2 = EppMetrics(bundled, namespace="ns"), EppMetrics(fine, namespace="ns")
    for m in (m1, m2):
        m.record_request("m", "t", 0)
        m.record_request("m", "t", 0)
        m.running_inc("m", "t")
    for _ in range(2):
        m1.scheduled("t", ep, 0.0004)
        m1.completed("m", "t", seconds, info)
        m2.scheduler_e2e(0.0004)
        m2.scheduler_attempt("success", "t", ep)
        m2.running_dec("m", "t")
        m2.record_duration("m", "t", seconds)
        if not info.error:
            m2.record_tokens("m", "t", info.prompt_tokens, info.completion_tokens, info.cached_tokens)
            m2.record_ntpot("m", "t", seconds, info.completion_tokens)
            if seconds > 0:  # a non-streamed answer's TTFT is its duration
                m2.observe_ttft("m", "t", seconds, streaming=False)
    assert samples(bundled) == samples(fine)
    lazy = CollectorRegistry()
    EppMetrics(lazy).record_request("m", "t", 0)
    assert {name for name, _ in samples(lazy) if name.startswith(("inference_objective_", "llm_d_epp_request"))} == {
        "inference_objective_request_total", "llm_d_epp_request_total"}


def test_two_instances_do_not_collide():
    r1, r2 = CollectorRegistry(), CollectorRegistry()
    m1, m2 = EppMetrics(r1), EppMetrics(r2)
    m1.record_request("a", "a", 0)
    assert value(r1, "inference_objective_request_total", model_name="a", target_model_name="a", priority="0") == 1
    assert ("inference_objective_request_total",
            frozenset({("model_name", "a"), ("target_model_name", "a"), ("priority", "0")})) not in samples(r2)
    assert m2.registry is r2


async def test_metrics_app_serves_text_openmetrics_and_gzip(metrics, registry):
    metrics.record_request("m", "t", 0)
    server = TestServer(make_metrics_app(registry), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.get(server.make_url("/metrics"), headers={"Accept-Encoding": "identity"}) as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
                text = (await r.read()).decode()
                assert 'inference_objective_request_total{model_name="m",priority="0",target_model_name="t"} 1.0' \
                    in text
            async with s.get(server.make_url("/metrics"),
                             headers={"Accept": "application/openmetrics-text; version=1.0.0",
                                      "Accept-Encoding": "identity"}) as r:
                assert r.headers["Content-Type"].startswith("application/openmetrics-text")
                assert (await r.read()).rstrip().endswith(b"# EOF")
            async with s.get(server.make_url("/metrics"), headers={"Accept-Encoding": "deflate, gzip"}) as r:
                assert r.headers.get("Content-Encoding") == "gzip"
                assert b"inference_extension_info" in gzip.decompress(await r.read())
    finally:
        await server.close()


# -- epp serve's /metrics: scheduler-attempt labels and the flow-control saturation gauge ---------------------


async def _scrape(app: EppApp) -> dict[tuple[str, frozenset], float]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{app.metrics_port}/metrics") as resp:
            text = await resp.text()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


async def test_scheduler_attempts_name_the_pod_and_its_namespace(fake_kube: FakeKube, tmp_path: Path) -> None:
    """A two-port pool gives the Pod two endpoints (``vllm-0-rank-0``/``-rank-1``); attempts count the Pod (the
    reference's ``metadata.PodName``) in the pool's namespace, on the chosen port."""
    app_labels = {"app": "vllm"}
    fake_kube.add_namespace("llm")
    async with SimPool([SimConfig(model="m", time_scale=0.01, seed=i) for i in range(2)]) as sims:
        ports = [s.port for s in sims.servers]
        fake_kube.create("inferencepools", "llm", {"metadata": {"name": "pool"}, "spec": {
            "selector": {"matchLabels": app_labels}, "targetPorts": [{"number": p} for p in ports]}})
        fake_kube.create("pods", "llm", {"metadata": {"name": "vllm-0", "labels": app_labels},
                                         "spec": {"containers": [{"name": "s", "image": "i"}]}})
        fake_kube.patch("pods", "llm", "vllm-0", {"status": {
            "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}, subresource="status")
        app = EppApp(ServeOptions(pool_name="pool", pool_namespace="llm", host="127.0.0.1", grpc_port=None,
                                  kubeconfig=str(fake_kube.kubeconfig(tmp_path / "kubeconfig", "llm")),
                                  health_port=None, metrics_port=0, http_port=0))
        await app.start()
        try:
            await app.wait_ready()
            await eventually(lambda: len(app.datastore.endpoints()) == 2, what="both ranks discovered")
            async with aiohttp.ClientSession() as session:
                for _ in range(4):
                    async with session.post(app.gateway.url + "/v1/completions",
                                            json={"model": "m", "prompt": "hi", "max_tokens": 2}) as resp:
                        assert resp.status == 200
            scraped = await _scrape(app)
        finally:
            await app.stop()
    attempts = {dict(labels)["port"]: v for (name, labels), v in scraped.items()
                if name == "inference_extension_scheduler_attempts_total"
                and dict(labels)["pod_name"] == "vllm-0" and dict(labels)["namespace"] == "llm"}
    assert sum(attempts.values()) == 4 and set(attempts) <= {str(p) for p in ports}


FLOW_CONTROL_CONFIG = """\
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: utilization-detector
  parameters: {metricsStalenessThreshold: 60s}
saturationDetector: {pluginRef: utilization-detector}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
"""


def _vllm_page(waiting: int) -> bytes:
    return (f"vllm:num_requests_waiting {waiting}\nvllm:num_requests_running 0\n"
            f"vllm:kv_cache_usage_perc 0.0\n").encode()


async def test_pool_saturation_follows_the_pool_with_no_request_queued(metrics_server, tmp_path: Path) -> None:
    """No request is ever sent: the gauge is the detector's saturation over the pool at each scrape (queue 4 of
    5 = 0.8, then 10 of 5 = 2.0), as the reference records it every dispatch cycle."""
    metrics_server.serve(_vllm_page(4))
    config, endpoints = tmp_path / "epp.yaml", tmp_path / "endpoints.yaml"
    config.write_text(FLOW_CONTROL_CONFIG)
    endpoints.write_text(f"endpoints:\n  - {{name: s0, address: 127.0.0.1, port: {metrics_server.port}}}\n")
    app = EppApp(ServeOptions(config=str(config), endpoints_file=str(endpoints), host="127.0.0.1", grpc_port=None,
                              health_port=None, metrics_port=0, http_port=None, refresh_interval=0.02))
    await app.start()
    key = ("inference_extension_flow_control_pool_saturation", frozenset({("inference_pool", "static-pool")}))
    try:
        await app.wait_ready()
        await eventually(lambda: app.datastore.get("s0").metrics.waiting == 4, what="first scrape")
        assert (await _scrape(app))[key] == pytest.approx(0.8)
        metrics_server.serve(_vllm_page(10))
        await eventually(lambda: app.datastore.get("s0").metrics.waiting == 10, what="second scrape")
        assert (await _scrape(app))[key] == pytest.approx(2.0)
    finally:
        await app.stop()


# -- epp serve's /metrics after real requests: every family under its legacy and its llm-d name ----------------


async def test_every_family_is_exported_under_both_names_after_real_requests(tmp_path: Path) -> None:
    """Requests through the gateway with flow control on, one of them refused: each legacy family on /metrics has
    its ``llm_d_epp_*`` replacement with the same series (the reference's label renames applied, and summed over
    the ``fairness_id``/``priority`` labels the request families' replacements add), which carry the request's
    fairness id and priority; EPP-observed TTFT (by ``streaming``), streamed TPOT and ITL are exported under the
    reference's new names only."""
    async with SimPool([SimConfig(model="m", time_scale=0.01, seed=i) for i in range(2)]) as sims:
        config, endpoints = tmp_path / "epp.yaml", tmp_path / "endpoints.yaml"
        config.write_text(FLOW_CONTROL_CONFIG)
        endpoints.write_text("endpoints:\n" + "".join(
            f"  - {{name: s{i}, address: 127.0.0.1, port: {s.port}}}\n" for i, s in enumerate(sims.servers)))
        app = EppApp(ServeOptions(config=str(config), endpoints_file=str(endpoints), host="127.0.0.1",
                                  grpc_port=None, health_port=None, metrics_port=0, http_port=0,
                                  refresh_interval=0.02))
        await app.start()
        try:
            await app.wait_ready()
            await eventually(lambda: all(ep.metrics.update_time > 0 for ep in app.datastore.endpoints()),
                             what="both scraped")
            async with aiohttp.ClientSession() as session:
                for tenant, stream in (("tenant-a", False), ("tenant-b", True)):
                    body = {"model": "m", "prompt": "hello", "max_tokens": 4, "stream": stream,
                            "stream_options": {"include_usage": True}} if stream else \
                        {"model": "m", "prompt": "hello", "max_tokens": 4}
                    async with session.post(app.gateway.url + "/v1/completions", json=body,
                                            headers={"x-llm-d-router-inference-fairness-id": tenant}) as resp:
                        assert resp.status == 200
                        await resp.read()
                async with session.post(app.gateway.url + "/v1/completions", data=b"{not json") as resp:
                    assert resp.status == 400
                async with session.get(f"http://127.0.0.1:{app.metrics_port}/metrics") as resp:
                    text = await resp.text()
        finally:
            await app.stop()
    assert check_llmd_twins(text) == {*RENAMED, *SPLIT}  # the empty ones too
    scraped = {(s.name, frozenset(s.labels.items())): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    M = {("model_name", "m"), ("target_model_name", "m")}
    assert scraped[("inference_objective_request_total", frozenset({*M, ("priority", "0")}))] == 2
    assert scraped[("llm_d_epp_request_error_total", frozenset({("model_name", ""), ("target_model_name", ""),
                                                                ("fairness_id", ""), ("priority", "0"),
                                                                ("error_code", "BadRequest")}))] == 1
    for tenant, streaming in (("tenant-a", "false"), ("tenant-b", "true")):
        F = frozenset({*M, ("fairness_id", tenant), ("priority", "0")})
        for family in ("request_total", "request_ntpot_seconds_count", "request_duration_seconds_count",
                       "request_size_bytes_count", "response_size_bytes_count", "request_input_tokens_count",
                       "request_output_tokens_count"):
            assert scraped[(f"llm_d_epp_{family}", F)] == 1, (family, tenant)
        assert scraped[("llm_d_epp_request_running", F)] == 0
        assert scraped[("llm_d_epp_request_ttft_seconds_count", F | {("streaming", streaming)})] == 1
    streamed = frozenset({*M, ("fairness_id", "tenant-b"), ("priority", "0")})
    assert scraped[("llm_d_epp_request_streaming_itl_seconds_count", streamed)] >= 1
    assert scraped[("llm_d_epp_request_streaming_tpot_seconds_count", streamed)] == 1
    assert not any(name.startswith("llm_d_epp_request_streaming") and dict(labels)["fairness_id"] == "tenant-a"
                   for name, labels in scraped)
    assert scraped[("llm_d_epp_ready_endpoints", frozenset({("name", "static-pool")}))] == 2
    attempts = [v for (name, labels), v in scraped.items() if name == "llm_d_epp_scheduler_attempts_total"
                and dict(labels)["endpoint_name"] in ("s0", "s1")]
    assert sum(attempts) == 2
    assert sum(v for (name, labels), v in scraped.items()
               if name == "llm_d_epp_flow_control_request_queue_duration_seconds_count"
               and dict(labels)["outcome"] == "Dispatched") == 2
