"""probabilistic-admitter end to end: ``epp serve`` (HTTP gateway) with llm-d-router's README config, a simulated
vLLM server scraped for real, and InferenceObjectives from the endpoints file. A long request holding most of the
KV cache saturates the pool; then a sheddable request is refused with the reference's error while critical and
standard ones are still served."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import orjson
import pytest

from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimPool

from ..conftest import eventually

CONFIG = Path(__file__).parent.parent / "fixtures/configs/llmd/HEAD_probabilistic-admitter-readme-snippet.yaml"
OBJECTIVE = "x-gateway-inference-objective"
ENDPOINTS = """\
endpoints:
- {name: sim, address: 127.0.0.1, port: %d}
inferenceObjectives:
- {name: batch-workload, priority: -1}
- {name: interactive-workload, priority: 1}
"""


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[EppApp, str]]:
    """EPP serving the README config over one simulated server (a 1024-token KV cache, slowed 20x so a long
    request keeps its blocks for the whole test)."""
    async with SimPool([SimConfig(model="m", num_gpu_blocks=64, time_scale=20)]) as pool:
        endpoints = tmp_path / "endpoints.yaml"
        endpoints.write_text(ENDPOINTS % pool.servers[0].port)
        app = EppApp(ServeOptions(config=str(CONFIG), endpoints_file=str(endpoints), host="127.0.0.1",
                                  grpc_port=None, metrics_port=None, http_port=0, refresh_interval=0.05))
        await app.start()
        try:
            yield app, app.gateway.url
        finally:
            await app.stop()


async def complete(session: aiohttp.ClientSession, url: str, objective: str | None) -> tuple[int, dict[str, Any],
                                                                                             dict[str, str]]:
    headers = {OBJECTIVE: objective} if objective else {}
    body = {"model": "m", "prompt": "hello there", "max_tokens": 2}
    async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
        return resp.status, orjson.loads(await resp.read()), dict(resp.headers)


async def test_sheddable_request_is_shed_under_saturation_critical_is_served(
        served: tuple[EppApp, str]) -> None:
    app, url = served
    [endpoint] = app.datastore.endpoints()
    await eventually(lambda: endpoint.metrics.update_time > 0, "the first scrape")
    async with aiohttp.ClientSession() as session:
        # Idle pool: saturation 0, so nothing is shed.
        status, answer, _ = await complete(session, url, "batch-workload")
        assert status == 200 and answer["choices"][0]["text"]

        hog = {"model": "m", "prompt": "hold " * 500, "max_tokens": 300, "stream": True}
        async with session.post(url + "/v1/completions", json=hog,
                                headers={OBJECTIVE: "interactive-workload"}) as held:
            assert held.status == 200
            await held.content.readline()  # running: its ~500 prompt tokens now hold the KV cache
            await eventually(lambda: endpoint.metrics.kv_usage >= 0.5, "a scrape showing the KV cache held")
            # Saturation >= 0.5 / 0.8: the shedding probability is 1 (the neutered detector still says < 1).
            assert app.pipeline.saturation_detector.saturation([endpoint]) < 1.0

            status, answer, headers = await complete(session, url, "batch-workload")
            assert status == 500
            error = answer["error"]
            assert error["message"].startswith("request cannot be admitted: probabilistic-admitter: rejected, "
                                               "saturation=0.")
            assert error["message"].endswith("prob=1.00")
            assert (error["type"], error["param"], error["code"]) == ("server_error", None, "Internal")
            assert "x-llm-d-router-request-dropped-reason" not in {k.lower() for k in headers}

            for objective in ("interactive-workload", None):  # critical, and standard (priority 0)
                status, answer, _ = await complete(session, url, objective)
                assert status == 200 and answer["usage"]["completion_tokens"] == 2
