"""The gateway's ``GET /v1/models`` answers from the lists a ``models-data-extractor`` stored on the endpoints, and
asks the endpoints itself only for those without one (no extractor configured, or not polled successfully yet).

Real simulated vLLM servers throughout; an adapter loaded on a server after its only poll (``interval: 1h``)
shows whether the gateway read the stored list or asked the server again."""

from __future__ import annotations

from typing import Any, AsyncIterator

import aiohttp
import pytest

from epp.datalayer.datastore import Datastore
from epp.datalayer.models import parse_models, stored_models
from epp.framework.endpoint import EndpointSpec
from epp.framework.plugins import NoParams
from epp.gateway import ModelCatalog
from epp.plugins.datalayer.models_extractor import ModelsExtractor
from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimPool

from ..conftest import eventually

MODELS_CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: models-data-source
  parameters: {interval: 1h}
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


async def _lora(url: str, name: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": "/a"}) as r:
            assert r.status == 200, await r.text()


async def _gateway_models(app: EppApp) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.get(app.gateway.url + "/v1/models") as resp:
            assert resp.status == 200
            body = await resp.json()
    assert body["object"] == "list"
    return body["data"]


@pytest.fixture
async def pool() -> AsyncIterator[SimPool]:
    async with SimPool([SimConfig(time_scale=0.01, seed=i, enable_lora=True, lora_adapters=[f"base-{i}"])
                        for i in range(2)]) as p:
        yield p


async def _app(pool: SimPool, config: str) -> EppApp:
    specs = [EndpointSpec(f"sim-{i}", "127.0.0.1", s.port) for i, s in enumerate(pool.servers)]
    app = EppApp(ServeOptions(config_text=config, endpoints=specs, host="127.0.0.1", grpc_port=None,
                              health_port=None, metrics_port=None, http_port=0, refresh_interval=0.02))
    await app.start()
    return app


async def test_gateway_lists_the_stored_models(pool: SimPool) -> None:
    app = await _app(pool, MODELS_CONFIG)
    try:
        source = app.pipeline.handle.plugin("models-data-source")
        assert source.interval == 3600.0 and source.base_tick == 0.02  # rounded to --refresh-metrics-interval
        endpoints = app.datastore.endpoints()
        await eventually(lambda: all(stored_models(ep) is not None for ep in endpoints), "every endpoint polled")
        await _lora(pool.servers[0].url, "loaded-after-the-poll")
        cards = await _gateway_models(app)
        assert sorted(c["id"] for c in cards) == ["base-0", "base-1", "sim-model"]  # the stored lists, not asked
        by_id = {c["id"]: c for c in cards}
        assert by_id["base-0"]["parent"] == "sim-model" and by_id["sim-model"]["parent"] is None
        assert by_id["sim-model"]["object"] == "model" and by_id["sim-model"]["owned_by"] == "vllm"
    finally:
        await app.stop()


async def test_without_an_extractor_the_gateway_asks_the_endpoints(pool: SimPool) -> None:
    app = await _app(pool, "plugins:\n- type: queue-scorer\n")
    try:
        await _lora(pool.servers[0].url, "loaded-before-asking")
        ids = sorted(c["id"] for c in await _gateway_models(app))
        assert ids == ["base-0", "base-1", "loaded-before-asking", "sim-model"]
        assert all(stored_models(ep) is None for ep in app.datastore.endpoints())
    finally:
        await app.stop()


async def test_catalog_mixes_stored_lists_and_asking(pool: SimPool) -> None:
    """An endpoint with a stored list is not asked; one without is asked on demand."""
    datastore = Datastore("p")
    datastore.replace_all([EndpointSpec(f"sim-{i}", "127.0.0.1", s.port) for i, s in enumerate(pool.servers)])
    stored = datastore.get("sim-0")
    ModelsExtractor("x", NoParams()).extract(stored, parse_models(
        b'{"object": "list", "data": [{"id": "sim-model"}, {"id": "stored-only", "parent": "sim-model"}]}'))
    async with aiohttp.ClientSession() as session:
        catalog = ModelCatalog(datastore, lambda: session, ttl=0)
        ids = [c["id"] for c in await catalog.models()]
    assert ids == ["sim-model", "stored-only", "base-1"]  # sim-0's own base-0 was not asked for
