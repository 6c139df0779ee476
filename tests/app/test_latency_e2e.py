"""predicted-latency-producer end to end: ``epp serve`` (HTTP gateway) over two simulated vLLM servers, scraped for
real. Six long streams hold one server busy; its engine steps then last ~30 ms instead of ~6 ms (the simulator's
per-sequence decode cost is raised to make the gap plain), so requests there meet a longer TTFT and TPOT. After a
warm-up of streamed requests to both servers the in-process model has learnt from what they met, and it predicts
a higher TTFT and TPOT on the busy server than on the idle one."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest

from epp.framework.request import parse_request
from epp.latency import LATENCY_PREDICTIONS_KEY, predictions_of
from epp.plugins.filters.header_based_testing import SELECTION_HEADER
from epp.plugins.producers.predicted_latency import PredictedLatencyProducer
from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimPool
from epp_sim.config import TimeModel

from ..conftest import eventually

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
  parameters:
    streamingMode: true
- type: header-based-testing-filter
"""
ENDPOINTS = "endpoints:\n- {name: busy, address: 127.0.0.1, port: %d}\n- {name: idle, address: 127.0.0.1, port: %d}\n"
HOGS = 6


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[EppApp, dict[str, int]]]:
    sim = SimConfig(model="m", time_model=TimeModel(decode_s_per_seq=0.004))
    async with SimPool([sim, sim]) as pool:
        ports = {"busy": pool.servers[0].port, "idle": pool.servers[1].port}
        endpoints = tmp_path / "endpoints.yaml"
        endpoints.write_text(ENDPOINTS % (ports["busy"], ports["idle"]))
        config = tmp_path / "config.yaml"
        config.write_text(CONFIG)
        app = EppApp(ServeOptions(config=str(config), endpoints_file=str(endpoints), host="127.0.0.1",
                                  grpc_port=None, metrics_port=0, http_port=0, refresh_interval=0.05,
                                  shutdown_grace=1.0))
        await app.start()
        try:
            yield app, ports
        finally:
            await app.stop()


def body(prompt: str, max_tokens: int) -> dict[str, object]:
    return {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}


async def test_a_loaded_endpoint_gets_a_higher_predicted_ttft_and_tpot(
        served: tuple[EppApp, dict[str, int]]) -> None:
    app, ports = served
    url = app.gateway.url
    producer = app.pipeline.handle.first_of_type("predicted-latency-producer")
    assert isinstance(producer, PredictedLatencyProducer) and producer.metrics is not None
    busy, idle = (app.datastore.get(n) for n in ("busy", "idle"))
    assert busy is not None and idle is not None
    await eventually(lambda: busy.metrics.update_time > 0 and idle.metrics.update_time > 0, "the first scrapes")

    def probe() -> dict[str, object]:
        # The probe looks like a warm-up request (same prompt length): a linear model is asked to interpolate,
        # not to extrapolate to an input length it never saw (that may go below 0 and clamp to 0).
        prompt = "probe 99 " * 20
        request = parse_request("/v1/completions", b'{"model": "m", "prompt": "%s"}' % prompt.encode(),
                                {"x-llm-d-router-slo-ttft-ms": "1000", "x-llm-d-router-slo-tpot-ms": "50"})
        return app.pipeline.scheduler.prepare(request, [busy, idle])

    assert LATENCY_PREDICTIONS_KEY not in probe()  # no model yet: readers see every endpoint as unknown
    async with aiohttp.ClientSession() as session, contextlib.AsyncExitStack() as hogs:
        for i in range(HOGS):
            hog = await hogs.enter_async_context(session.post(
                url + "/v1/completions", json=body(f"hog {i} " * 50, 5000),
                headers={SELECTION_HEADER: f"127.0.0.1:{ports['busy']}"}))
            assert hog.status == 200
            await hog.content.readline()  # streaming: it holds a slot on the busy server
        await eventually(lambda: busy.metrics.running >= HOGS, "a scrape showing the busy server's streams")
        for i in range(24):  # the warm-up: alternate servers, one request at a time
            target = ("busy", "idle")[i % 2]
            async with session.post(url + "/v1/completions", json=body(f"warm-up {i} " * 20, 6),
                                    headers={SELECTION_HEADER: f"127.0.0.1:{ports[target]}"}) as resp:
                assert resp.status == 200
                assert b'"completion_tokens":6' in (await resp.read()).replace(b" ", b"")
        # Each warm-up request met a scrape of its server showing no request of its own kind in flight; so does
        # the probe, once the last warm-up request (to the idle server) has left the idle server's scrape.
        await eventually(lambda: idle.metrics.running == 0 and idle.metrics.kv_usage == 0.0, "the idle server's scrape")
        predictions = predictions_of(probe())
        async with session.get(f"http://127.0.0.1:{app.metrics_port}/metrics") as resp:
            exposition = await resp.text()

    assert producer.predictor.ttft_ready and producer.predictor.tpot_ready
    assert set(predictions) == {"busy", "idle"}
    on_busy, on_idle = predictions["busy"], predictions["idle"]
    assert on_busy.ttft > on_idle.ttft > 0
    assert on_busy.tpot > on_idle.tpot > 0
    assert on_busy.ttft_headroom == pytest.approx(1000 - on_busy.ttft)
    assert on_busy.tpot_headroom == pytest.approx(50 - on_busy.tpot)
    assert (on_busy.dispatched_request_count, on_idle.dispatched_request_count) == (HOGS, 0)
    assert 'inference_objective_request_ttft_seconds_count{' in exposition
    assert 'llm_d_epp_request_tpot_seconds_count{' in exposition
