"""The data layer's error counters (the reference's ``datalayer_poll_errors_total{source_type}`` and
``datalayer_extract_errors_total{source_type, extractor_type}``, under ``llm_d_epp_`` and their deprecated
``llm_d_inference_scheduler_`` names), counted by the scraper and the models source against real failing servers
on 127.0.0.1 and read back from EPP's ``/metrics`` over HTTP."""

from __future__ import annotations

from typing import Any, AsyncIterator, ClassVar

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.datalayer.models import ModelsResponse, stored_models
from epp.datalayer.scraper import ScrapeConfig, Scraper
from epp.framework.endpoint import Endpoint, EndpointSpec
from epp.metrics.families import EppMetrics, make_metrics_app
from epp.runtime.builtins import default_registry

from ..conftest import eventually
from .llmd_reference import check_llmd_twins
from .models_server import ModelsServer

FAST = ScrapeConfig(interval=0.01, timeout=0.2, max_backoff=0.02, failure_threshold=3, staleness=5.0)
GOOD_PAGE = b"vllm:num_requests_waiting 1\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n"


@pytest.fixture
def metrics() -> EppMetrics:
    return EppMetrics(CollectorRegistry())


@pytest.fixture
async def metrics_url(metrics: EppMetrics) -> AsyncIterator[str]:
    server = TestServer(make_metrics_app(metrics.registry), host="127.0.0.1", port=0)
    await server.start_server()
    yield str(server.make_url("/metrics"))
    await server.close()


async def scrape(url: str) -> tuple[str, dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    """EPP's /metrics text and its samples."""
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as resp:
            text = await resp.text()
    return text, {(s.name, frozenset(s.labels.items())): s.value
                  for fam in text_string_to_metric_families(text) for s in fam.samples}


def spec(name: str, port: int) -> EndpointSpec:
    return EndpointSpec(name, "127.0.0.1", port)


async def test_the_scraper_counts_failed_fetches_as_poll_errors_and_unusable_pages_as_extract_errors(
        datastore: Datastore, make_metrics_server, metrics: EppMetrics, metrics_url: str) -> None:
    """A 500, a refused connection and a page that does not parse fail the fetch (``metrics-data-source`` poll
    errors); a page without the engine's families fails ``core-metrics-extractor``; a good page counts nothing."""
    servers = {name: await make_metrics_server() for name in ("ok", "500", "malformed", "missing")}
    servers["ok"].serve(GOOD_PAGE)
    servers["500"].serve(b"boom", status=500)
    servers["malformed"].serve(b'vllm:num_requests_waiting{engine="0" 1\n' + GOOD_PAGE)
    servers["missing"].serve(b"process_cpu_seconds_total 1\n")
    datastore.replace_all([*(spec(n, s.port) for n, s in servers.items()), spec("gone", 1)])
    eps = {ep.name: ep for ep in datastore.endpoints()}
    scraper = Scraper(datastore, FAST, errors=metrics)
    await scraper.start()
    try:
        await eventually(lambda: all(eps[n].scrape_failures >= 2 for n in ("500", "malformed", "missing", "gone")),
                         what="every failing endpoint scraped twice")
    finally:
        await scraper.stop()
    text, scraped = await scrape(metrics_url)
    polls = sum(eps[n].scrape_failures for n in ("500", "malformed", "gone"))
    for prefix in ("llm_d_epp_", "llm_d_inference_scheduler_"):
        assert scraped[(prefix + "datalayer_poll_errors_total",
                        frozenset({("source_type", "metrics-data-source")}))] == polls
        assert scraped[(prefix + "datalayer_extract_errors_total", frozenset({
            ("source_type", "metrics-data-source"), ("extractor_type", "core-metrics-extractor")}))] == \
            eps["missing"].scrape_failures
    assert eps["ok"].scrape_failures == 0 and eps["ok"].metrics.running == 2
    assert {"llm_d_inference_scheduler_datalayer_poll_errors",
            "llm_d_inference_scheduler_datalayer_extract_errors"} <= check_llmd_twins(text)


class RaisingExtractor:
    """A models-data-source extractor that fails on every response."""

    type_name: ClassVar[str] = "raising-extractor"
    source_type: ClassVar[str] = "models-data-source"
    name = "raising"

    def extract(self, endpoint: Endpoint, response: ModelsResponse) -> None:
        raise RuntimeError(f"cannot use {len(response.data)} models")


async def test_the_models_source_counts_failed_polls_and_failing_extractors(
        datastore: Datastore, metrics: EppMetrics, metrics_url: str) -> None:
    """A status 500 and a body that is not the list object are poll errors of ``models-data-source``; an extractor
    that raises on a good list is an extract error (``raising-extractor``), and does not keep the other extractor
    from storing the list."""
    good, broken, garbage = ModelsServer(), ModelsServer(), ModelsServer()
    for server in (good, broken, garbage):
        await server.start()
    good.serve("base")
    broken.mode, broken.status, garbage.mode = "status", 500, "garbage"
    text = "plugins:\n- type: models-data-source\n- type: models-data-extractor\n"
    source: Any = build_pipeline(*load_raw(text), default_registry(entry_points=False)).handle.plugin(
        "models-data-source")
    source.bind_extractor(RaisingExtractor())
    source.use_base_tick(0.01)
    source.use_datalayer_errors(metrics)
    datastore.replace_all([spec("good", good.port), spec("500", broken.port), spec("garbage", garbage.port)])
    eps = {ep.name: ep for ep in datastore.endpoints()}
    await source.start(datastore)
    try:
        poller = source.poller
        await eventually(lambda: poller.stats.ok >= 2 and poller.failures(eps["500"]) >= 2
                         and poller.failures(eps["garbage"]) >= 2, what="polls of every endpoint")
        expected_polls = poller.failures(eps["500"]) + poller.failures(eps["garbage"])
        expected_extracts = poller.stats.ok  # read together: no poll runs between these lines and the next
        counted_polls = metrics.poll_errors.labels("models-data-source").value
        counted_extracts = metrics.extract_errors.labels("models-data-source", "raising-extractor").value
    finally:
        await source.stop()
        for server in (good, broken, garbage):
            await server.stop()
    assert (counted_polls, counted_extracts) == (expected_polls, expected_extracts)
    _, scraped = await scrape(metrics_url)
    assert scraped[("llm_d_epp_datalayer_extract_errors_total", frozenset({
        ("source_type", "models-data-source"), ("extractor_type", "raising-extractor")}))] == expected_extracts
    assert scraped[("llm_d_epp_datalayer_poll_errors_total",
                    frozenset({("source_type", "models-data-source")}))] == expected_polls
    assert [m.id for m in stored_models(eps["good"]) or ()] == ["base"]
