"""The scraper against real HTTP servers on 127.0.0.1: the simulator, and servers that misbehave.

Every misbehaviour (switching metric names, garbage, errors, timeouts, disappearing) must leave EPP running and
be reflected in ``Endpoint.healthy`` / ``scrape_failures``; recovery must be picked up without intervention.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer import build_scraper
from epp.datalayer.parsing import MetricsParseError
from epp.datalayer.scraper import MetricsExtractor, ScrapeConfig, Scraper
from epp.datalayer.static import StaticFileDiscovery
from epp.errors import ConfigError
from epp.extproc.tls import self_signed
from epp.framework.endpoint import ENGINE_LABEL, LEGACY_ENGINE_LABEL, EndpointSpec, LoraLoadState
from epp.runtime.builtins import default_registry
from epp_sim.config import SimConfig
from epp_sim.server import SimServer

from ..conftest import eventually
from .helpers import MetricsServer

FAST = ScrapeConfig(interval=0.01, timeout=0.2, max_backoff=0.05, failure_threshold=3, staleness=5.0)


@pytest.fixture(params=["lean", "aiohttp"])
def transport(request) -> str:
    """Every behaviour test runs over both HTTP transports."""
    return request.param


def cfg(transport: str, base: ScrapeConfig = FAST, **kw) -> ScrapeConfig:
    return dataclasses.replace(base, transport=transport, **kw)


@pytest.fixture
async def scraper(datastore, transport):
    s = Scraper(datastore, cfg(transport))
    await s.start()
    yield s
    await s.stop()


def spec(name: str, port: int, **kw) -> EndpointSpec:
    return EndpointSpec(name, "127.0.0.1", port, **kw)


@pytest.mark.parametrize("v0", [False, True], ids=["v1", "v0-flag"])
async def test_scrapes_the_simulator(datastore, scraper, v0):
    sim = SimServer(SimConfig(num_gpu_blocks=777, block_size=32, v0_metrics=v0, enable_lora=True,
                              lora_adapters=["sql-lora"], max_loras=3))
    await sim.start()
    try:
        ep = datastore.upsert(spec("sim", sim.port))
        await eventually(lambda: ep.metrics.update_time > 0, what="first scrape of the simulator")
        m = ep.metrics
        assert (m.block_size, m.num_gpu_blocks, m.max_lora) == (32, 777, 3)
        assert (m.waiting, m.running, m.kv_usage) == (0, 0, 0.0)
        assert ep.healthy and ep.scrape_failures == 0
    finally:
        await sim.stop()


async def test_switching_metric_names_garbage_and_back(datastore, scraper, metrics_server, v0_page, v1_page):
    metrics_server.serve(v1_page)
    ep = datastore.upsert(spec("a", metrics_server.port))
    await eventually(lambda: ep.metrics.running == 12, what="V1 page scraped")

    metrics_server.serve(v0_page)  # an older vLLM took its place: V0 names
    await eventually(lambda: ep.metrics.num_gpu_blocks == 81767, what="V0 page scraped")
    assert ep.healthy

    metrics_server.serve(b"sglang:num_queue_reqs 1\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\n")
    await eventually(lambda: not ep.healthy, what="unhealthy on unknown names")
    assert ep.scrape_failures >= FAST.failure_threshold

    metrics_server.serve(b"<html>oops</html>")
    failures = ep.scrape_failures
    await eventually(lambda: ep.scrape_failures > failures, what="garbage counted as failures")

    metrics_server.serve(v1_page)
    await eventually(lambda: ep.healthy and ep.scrape_failures == 0, what="recovery")
    assert ep.metrics.running == 12


@pytest.mark.parametrize("status", [500, 404, 302])
async def test_non_200_is_a_failure(datastore, scraper, metrics_server, v1_page, status):
    metrics_server.serve(v1_page, status=status)
    ep = datastore.upsert(spec("a", metrics_server.port))
    await eventually(lambda: not ep.healthy, what=f"unhealthy on HTTP {status}")
    assert ep.metrics.update_time == 0


async def test_timeouts_and_dropped_connections(datastore, scraper, metrics_server, v1_page):
    metrics_server.serve(v1_page)
    ep = datastore.upsert(spec("a", metrics_server.port))
    await eventually(lambda: ep.metrics.update_time > 0, what="first scrape")

    metrics_server.mode = "hang"
    await eventually(lambda: not ep.healthy, what="unhealthy after timeouts")
    # The last good snapshot is kept, only health changes. (Taken once unhealthy: a scrape already in flight
    # when the server started hanging may still have landed a newer good snapshot.)
    good = ep.metrics
    assert good.update_time > 0 and good.running == 12
    failures = ep.scrape_failures
    await eventually(lambda: ep.scrape_failures > failures, what="more timeouts")
    assert ep.metrics is good

    metrics_server.mode = "drop"
    failures = ep.scrape_failures
    await eventually(lambda: ep.scrape_failures > failures + 1, what="dropped connections counted")

    metrics_server.serve(v1_page)
    await eventually(lambda: ep.healthy, what="recovery after hangs")


async def test_server_disappears_and_comes_back(datastore, scraper, metrics_server, v1_page):
    metrics_server.serve(v1_page)
    ep = datastore.upsert(spec("a", metrics_server.port))
    await eventually(lambda: ep.metrics.update_time > 0, what="first scrape")
    await metrics_server.stop()
    await eventually(lambda: not ep.healthy, what="unhealthy when the server is gone")
    await metrics_server.start()  # same port
    await eventually(lambda: ep.healthy and ep.scrape_failures == 0, what="healthy when it is back")
    assert scraper.scraping(ep)


async def test_staleness_marks_unhealthy_before_the_failure_threshold(datastore, metrics_server, v1_page, transport):
    config = ScrapeConfig(interval=0.01, timeout=0.1, max_backoff=0.02, failure_threshold=10_000, staleness=0.3,
                          transport=transport)
    s = Scraper(datastore, config)
    await s.start()
    try:
        metrics_server.serve(v1_page)
        ep = datastore.upsert(spec("a", metrics_server.port))
        await eventually(lambda: ep.metrics.update_time > 0, what="first scrape")
        metrics_server.mode = "hang"
        await eventually(lambda: not ep.healthy, what="stale")
        assert 0 < ep.scrape_failures < config.failure_threshold
    finally:
        await s.stop()


async def test_never_answering_endpoint_never_becomes_healthy(datastore, metrics_server, transport):
    s = Scraper(datastore, ScrapeConfig(interval=0.01, timeout=0.05, max_backoff=0.02, failure_threshold=10_000,
                                        staleness=0.2, transport=transport))
    await s.start()
    try:
        metrics_server.mode = "hang"
        ep = datastore.upsert(spec("a", metrics_server.port))
        assert not ep.healthy  # never scraped: not healthy until its first good scrape
        await eventually(lambda: ep.scrape_failures >= 2, what="scrapes keep failing")
        assert not ep.healthy
    finally:
        await s.stop()


async def test_follows_datastore_changes(datastore, scraper, make_metrics_server, v1_page, v0_page):
    one, two = await make_metrics_server(), await make_metrics_server()
    one.serve(v1_page)
    two.serve(v0_page)
    datastore.replace_all([spec("a", one.port), spec("b", two.port)])
    a, b = datastore.get("a"), datastore.get("b")
    await eventually(lambda: a.metrics.running == 12 and b.metrics.num_gpu_blocks == 81767, what="both scraped")

    datastore.upsert(spec("a", one.port, labels={"role": "decode"}))  # relabel: same object, loop continues
    assert datastore.get("a") is a and scraper.scraping(a)

    datastore.upsert(spec("a", two.port))  # new address: a new endpoint and a new loop
    a2 = datastore.get("a")
    assert a2 is not a and not scraper.scraping(a)
    await eventually(lambda: a2.metrics.num_gpu_blocks == 81767, what="new endpoint scraped")

    datastore.remove("b")
    await eventually(lambda: not scraper.scraping(b), what="loop stopped for a removed endpoint")
    hits = two.hits
    await asyncio.sleep(0.05)
    assert two.hits > hits  # still scraped through a2


async def test_engine_from_label_and_static_engine(datastore, scraper, metrics_server):
    metrics_server.serve(b"sglang:num_queue_reqs 1\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\n")
    by_label = datastore.upsert(spec("l", metrics_server.port, labels={ENGINE_LABEL: "sglang"}))
    by_field = datastore.upsert(EndpointSpec("f", "127.0.0.1", 1, metrics_port=metrics_server.port,
                                             engine="sglang"))
    await eventually(lambda: by_label.metrics.running == 2 and by_field.metrics.running == 2,
                     what="sglang pages parsed")


async def test_unknown_engine_falls_back_to_the_default_engine(datastore, scraper, metrics_server, v1_page,
                                                                caplog):
    """As the reference's MappingRegistry.Get: an engine name with no mapping is read with the default's."""
    metrics_server.serve(v1_page)
    with caplog.at_level(logging.WARNING, logger="epp.datalayer.scraper"):
        ep = datastore.upsert(spec("a", metrics_server.port, labels={ENGINE_LABEL: "vllm-tpu"}))
        await eventually(lambda: ep.healthy and ep.metrics.running == 12, what="read as vllm")
        hits = metrics_server.hits
        await eventually(lambda: metrics_server.hits >= hits + 3, what="more scrapes")
        metrics_server.serve(b"", status=500)  # failures must not re-resolve (and re-log) the engine
        await eventually(lambda: ep.scrape_failures >= 2, what="failures")
    warnings = [r.getMessage() for r in caplog.records if "'vllm-tpu' is not configured" in r.getMessage()]
    assert len(warnings) == 1 and "'vllm'" in warnings[0]


async def test_sglang_cache_geometry_from_old_and_new_pages(datastore, scraper, metrics_server):
    """SGLang moved its KV geometry from ``sglang:cache_config_info`` labels to ``sglang:page_size`` and
    ``sglang:num_pages`` gauges (the reference reads the gauges); both pages give block size and block count."""
    core = b"sglang:num_queue_reqs 1\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\n"
    metrics_server.serve(core + b"sglang:page_size{tp_rank=\"0\"} 16\nsglang:num_pages{tp_rank=\"0\"} 5000\n")
    ep = datastore.upsert(spec("s", metrics_server.port, labels={ENGINE_LABEL: "sglang"}))
    await eventually(lambda: (ep.metrics.block_size, ep.metrics.num_gpu_blocks) == (16, 5000),
                     what="geometry from the gauges")
    metrics_server.serve(core + b'sglang:cache_config_info{num_pages="200000",page_size="1"} 1\n')
    await eventually(lambda: (ep.metrics.block_size, ep.metrics.num_gpu_blocks) == (1, 200000),
                     what="geometry from cache_config_info (older SGLang)")


RESIDENCY_CONFIG = """\
plugins:
- type: queue-scorer
- type: metrics-data-source
  parameters: {refreshInterval: 10ms, timeout: 200ms, maxBackoff: 50ms, stalenessThreshold: 5s, transport: %s}
- type: core-metrics-extractor
  parameters:
    engineConfigs:
    - name: vllm
      queuedRequestsSpec: vllm:num_requests_waiting
      runningRequestsSpec: vllm:num_requests_running
      kvUsageSpec: vllm:kv_cache_usage_perc
      loraSpec: vllm:lora_requests_info
      loraLoadedSpec: vllm:lora_adapter_loaded
      loraGPULoadedSpec: vllm:num_gpu_loaded_lora_adapters
      loraGPUSlotsSpec: vllm:max_gpu_lora_adapters
      customMetrics:
      - {attributeKey: NixlFailedTransfers, metricSpec: vllm:nixl_num_failed_transfers_total, optional: true}
      - {attributeKey: prealloc, metricSpec: vllm:num_prealloc_reqs}
"""


async def test_lora_residency_and_custom_metrics_from_the_config(datastore, metrics_server, transport):
    """A scraper built from a config with the reference's residency specs and customMetrics, against a real
    server: values land on the endpoint's metrics; a required custom metric going missing fails the scrapes,
    an optional one is just absent."""
    registry = default_registry(entry_points=False)
    pipeline = build_pipeline(*load_raw(RESIDENCY_CONFIG % transport), registry)
    scraper = build_scraper(pipeline.config, pipeline.handle, registry, datastore)
    core = (b"vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.2\n"
            b'vllm:lora_adapter_loaded{adapter_name="sql",level="gpu",pinned="false"} 1\n'
            b'vllm:lora_adapter_loaded{adapter_name="fr",level="cpu",pinned="true"} 1\n'
            b'vllm:num_gpu_loaded_lora_adapters{model_name="llama"} 1\nvllm:max_gpu_lora_adapters 4\n')
    metrics_server.serve(core + b"vllm:num_prealloc_reqs 2\nvllm:nixl_num_failed_transfers_total 3\n")
    await scraper.start()
    try:
        ep = datastore.upsert(spec("a", metrics_server.port))
        await eventually(lambda: ep.metrics.custom.get("NixlFailedTransfers") == 3.0, what="first scrape")
        m = ep.metrics
        assert m.loaded_loras == {"sql": LoraLoadState("gpu"), "fr": LoraLoadState("cpu", pinned=True)}
        assert (m.gpu_loaded_loras, m.base_model, m.max_lora, m.custom["prealloc"]) == (1, "llama", 4, 2.0)
        metrics_server.serve(core + b"vllm:num_prealloc_reqs 5\n")  # the optional counter disappears
        await eventually(lambda: ep.metrics.custom == {"prealloc": 5.0}, what="optional metric absent")
        assert ep.healthy
        metrics_server.serve(core)  # the required one disappears too
        await eventually(lambda: not ep.healthy, what="unhealthy without a required custom metric")
        assert ep.metrics.custom == {"prealloc": 5.0}  # the last good snapshot stays
    finally:
        await scraper.stop()


async def test_llm_d_engine_label_wins_over_the_legacy_one(datastore, scraper, metrics_server):
    metrics_server.serve(b"sglang:num_queue_reqs 1\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\n")
    ep = datastore.upsert(spec("a", metrics_server.port,
                               labels={"llm-d.ai/engine-type": "sglang", LEGACY_ENGINE_LABEL: "vllm"}))
    await eventually(lambda: ep.metrics.running == 2, what="read as sglang")


async def test_errors_are_logged_once_per_change(datastore, scraper, metrics_server, v1_page, caplog):
    metrics_server.serve(b"garbage")
    with caplog.at_level(logging.INFO, logger="epp.datalayer.scraper"):
        ep = datastore.upsert(spec("a", metrics_server.port))
        await eventually(lambda: ep.scrape_failures >= 5, what="several failures")
        metrics_server.serve(v1_page)
        await eventually(lambda: ep.scrape_failures == 0, what="recovery")
    messages = [r.getMessage() for r in caplog.records]
    assert sum("scrape failed" in m for m in messages) == 1
    assert sum("recovered" in m for m in messages) == 1


async def test_metrics_path_and_port_from_spec(datastore, scraper, metrics_server, v1_page):
    metrics_server.serve(v1_page)
    ep = datastore.upsert(EndpointSpec("a", "127.0.0.1", 1, metrics_port=metrics_server.port,
                                       metrics_path="/custom/path"))
    await eventually(lambda: ep.metrics.running == 12, what="custom path scraped")


async def test_metrics_host_from_the_endpoints_file(tmp_path, datastore, scraper, make_metrics_server, v1_page,
                                                    v0_page):
    """The reference's file-discovery ``metricsHost``: the page comes from that host:port, not the address
    (127.0.0.2:1 serves nothing: the server listens on 127.0.0.1 only); an edit moves the scrape."""
    first, second = await make_metrics_server(), await make_metrics_server()
    first.serve(v1_page)
    second.serve(v0_page)
    path = tmp_path / "endpoints.yaml"
    entry = "endpoints: [{{name: a, address: 127.0.0.2, port: 1, metricsHost: '127.0.0.1:{port}'}}]"
    path.write_text(entry.format(port=first.port))
    discovery = StaticFileDiscovery(path, datastore, poll_interval=3600)
    await discovery.start()
    try:
        ep = datastore.get("a")
        await eventually(lambda: ep.metrics.running == 12 and ep.healthy, what="scraped from metricsHost")
        path.write_text(entry.format(port=second.port) + "\n")
        assert discovery.reload()
        assert datastore.get("a") is ep  # same address and port: same endpoint, new metrics location
        await eventually(lambda: ep.metrics.num_gpu_blocks == 81767, what="scraped from the new metricsHost")
    finally:
        await discovery.stop()


@pytest.fixture
async def tls_metrics_server(tmp_path):
    """A /metrics server that only speaks TLS (self-signed certificate)."""
    pair = self_signed()
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    server = MetricsServer(ssl_context=ctx)
    await server.start()
    yield server
    await server.stop()


async def test_endpoint_declared_https_is_scraped_over_tls(datastore, scraper, tls_metrics_server, v1_page):
    """The data source's scheme is http (the default), but the endpoint says https: TLS wins."""
    tls_metrics_server.serve(v1_page)
    ep = datastore.upsert(spec("tls", tls_metrics_server.port, scheme="https"))
    await eventually(lambda: ep.metrics.running == 12, what="https endpoint scraped")
    assert ep.healthy and ep.scrape_failures == 0


@pytest.mark.parametrize("with_client_cert", [True, False], ids=["client-cert", "no-client-cert"])
async def test_metrics_data_source_tls_files(tmp_path, datastore, v1_page, transport, with_client_cert):
    """llm-d-router's caCertPath / clientCertPath / clientKeyPath: verify the server, present a client cert."""
    files = {}
    for who in ("server", "client"):
        pair = self_signed()
        files[who] = (tmp_path / f"{who}.crt", tmp_path / f"{who}.key")
        files[who][0].write_bytes(pair.cert_pem)
        files[who][1].write_bytes(pair.key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*files["server"])
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(files["client"][0])
    server = MetricsServer(ssl_context=ctx)
    await server.start()
    raw = {"scheme": "https", "insecureSkipVerify": False, "caCertPath": str(files["server"][0])}
    if with_client_cert:
        raw |= {"clientCertPath": str(files["client"][0]), "clientKeyPath": str(files["client"][1])}
    source = default_registry(entry_points=False).create("metrics-data-source", "m", raw, None)
    s = Scraper(datastore, cfg(transport, ssl_context=source.scrape_config().ssl_context))
    try:
        server.serve(v1_page)
        await s.start()
        ep = datastore.upsert(spec("mtls", server.port, scheme="https"))
        if with_client_cert:
            await eventually(lambda: ep.metrics.running == 12, what="scraped over mTLS")
        else:
            await eventually(lambda: ep.scrape_failures >= 2, what="refused without a client certificate")
            assert ep.metrics.running == 0
    finally:
        await s.stop()
        await server.stop()


def test_metrics_data_source_tls_file_errors_name_the_field(tmp_path) -> None:
    registry = default_registry(entry_points=False)
    with pytest.raises(ConfigError) as info:
        registry.create("metrics-data-source", "m", {"clientCertPath": str(tmp_path / "c.crt")}, None)
    assert info.value.field == "clientKeyPath"
    with pytest.raises(ConfigError) as info:
        registry.create("metrics-data-source", "m", {"insecureSkipVerify": False,
                                                    "caCertPath": str(tmp_path / "missing.crt")}, None)
    assert info.value.field == "caCertPath"


async def test_stop_cancels_every_loop_and_ignores_later_changes(datastore, metrics_server, v1_page, transport):
    metrics_server.serve(v1_page)
    s = Scraper(datastore, cfg(transport))
    await s.start()
    datastore.replace_all([spec(f"e{i}", metrics_server.port) for i in range(5)])
    await eventually(lambda: all(ep.metrics.update_time > 0 for ep in datastore.endpoints()), what="all scraped")
    await s.stop()
    assert not any(s.scraping(ep) for ep in datastore.endpoints())
    datastore.upsert(spec("late", metrics_server.port))
    hits = metrics_server.hits
    await asyncio.sleep(0.05)
    assert metrics_server.hits == hits and not s.running


async def test_restart_after_stop(datastore, metrics_server, v1_page, transport):
    metrics_server.serve(v1_page)
    ep = datastore.upsert(spec("a", metrics_server.port))
    s = Scraper(datastore, cfg(transport))
    await s.start()
    await s.stop()
    await s.start()
    try:
        await eventually(lambda: ep.metrics.update_time > 0, what="scraped after restart")
    finally:
        await s.stop()


@pytest.mark.parametrize("compression,encoding", [(False, "identity"), (True, "gzip")])
async def test_compression_is_negotiated(datastore, metrics_server, v1_page, compression, encoding, transport):
    metrics_server.serve(v1_page)
    s = Scraper(datastore, ScrapeConfig(interval=0.01, timeout=0.5, compression=compression, transport=transport))
    await s.start()
    try:
        ep = datastore.upsert(spec("a", metrics_server.port))
        await eventually(lambda: ep.metrics.running == 12, what="page parsed")
        assert metrics_server.accept_encoding == encoding
    finally:
        await s.stop()


def test_extractor_engine_choice():
    ex = MetricsExtractor(default_engine="sglang")
    assert ex.engine_for(EndpointSpec("a", "h", 1)).name == "sglang"
    assert ex.engine_for(EndpointSpec("a", "h", 1, engine="vllm")).name == "vllm"
    assert ex.engine_for(EndpointSpec("a", "h", 1, labels={ENGINE_LABEL: "trtllm-serve"},
                                      engine="vllm")).name == "trtllm-serve"
    assert ENGINE_LABEL == "llm-d.ai/engine-type"
    # the legacy label is not read, as in the newest reference's getEngineTypeFromEndpoint
    assert ex.engine_for(EndpointSpec("a", "h", 1, labels={LEGACY_ENGINE_LABEL: "vllm"})).name == "sglang"
    assert ex.engine_for(EndpointSpec("a", "h", 1, labels={ENGINE_LABEL: "", LEGACY_ENGINE_LABEL: "vllm"},
                                      engine="trtllm-serve")).name == "trtllm-serve"
    assert ex.engine_for(EndpointSpec("a", "h", 1, labels={ENGINE_LABEL: "mystery"})).name == "sglang"
    with pytest.raises(MetricsParseError):
        ex.extract(b"nothing here", EndpointSpec("a", "h", 1))
    with pytest.raises(ValueError):
        MetricsExtractor(default_engine="nope")


@pytest.mark.parametrize("kw", [dict(interval=0), dict(timeout=-1), dict(jitter=1.0), dict(failure_threshold=0),
                                dict(scheme="ftp"), dict(staleness=0), dict(transport="curl")])
def test_scrape_config_validation(kw):
    with pytest.raises(ValueError):
        ScrapeConfig(**kw)
