"""``--enable-grpc-stream-metrics``: the reference's ext_proc stream families (in-flight gauge, hold-duration
histogram, completions by gRPC code) on both transports, driven by a real grpc.aio client against ``EppApp`` and read
by scraping its ``/metrics`` port; ``--workers`` peers report theirs to worker 0."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from epp.extproc.stream_metrics import StreamMetrics
from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EppApp, ServeOptions
from epp.runtime.workers import PeerLink

from ..conftest import Servers, eventually
from .helpers import Client, make_director, request_headers, specs

FAMILIES = ("llm_d_epp_extproc_streams_inflight", "llm_d_epp_extproc_stream_duration_seconds",
            "llm_d_epp_extproc_streams_total")
Scrape = Callable[[], Awaitable[dict[tuple[str, tuple[tuple[str, str], ...]], float]]]


@pytest.fixture
def epp(transport: str, servers: Servers) -> Callable[..., Awaitable[tuple[EppApp, Client, Scrape]]]:
    """``await epp(stream_metrics=True)`` -> (started app, ext_proc client, scrape of its /metrics port)."""

    async def factory(stream_metrics: bool = True) -> tuple[EppApp, Client, Scrape]:
        options = ServeOptions(endpoints=[EndpointSpec(name="a", address="127.0.0.1", port=9)], host="127.0.0.1",
                               grpc_port=0, health_port=None, metrics_port=0, plaintext=True,
                               extproc_transport=transport, grpc_stream_metrics=stream_metrics)
        app = await servers.start(EppApp(options))
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.extproc.port}")
        servers.defer(channel.close)

        async def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{app.metrics_port}/metrics") as resp:
                    text = await resp.text()
            return {(s.name, tuple(sorted(s.labels.items()))): s.value
                    for family in text_string_to_metric_families(text) for s in family.samples}

        return app, Client(channel), scrape

    return factory


async def scrape_until(scrape: Scrape, predicate: Callable[[dict], bool], what: str) -> dict:  # type: ignore[type-arg]
    """Scrape until ``predicate`` holds and return that scrape (the server records a stream's end when it has
    processed it)."""
    last: dict = {}  # type: ignore[type-arg]

    async def holds() -> dict | None:  # type: ignore[type-arg]
        last.clear()
        last.update(await scrape())
        return last if predicate(last) else None

    return await eventually(holds, lambda: f"{what}; last scrape: {last}", interval=0.02)


def value(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def completed(samples: dict, code: str) -> float:  # type: ignore[type-arg]
    return value(samples, "llm_d_epp_extproc_streams_total", code=code)


async def test_families_are_registered_only_with_the_flag(epp) -> None:
    _, _, scrape = await epp(stream_metrics=False)
    assert not any(name.startswith("llm_d_epp_extproc_") for name, _ in await scrape())
    _, _, scrape = await epp(stream_metrics=True)
    samples = await scrape()
    assert value(samples, FAMILIES[0]) == 0 and value(samples, FAMILIES[1] + "_count") == 0
    assert value(samples, FAMILIES[1] + "_bucket", le="0.001") == 0  # the reference's buckets, 1 ms to 10 min
    assert value(samples, FAMILIES[1] + "_bucket", le="600.0") == 0


async def test_an_open_stream_is_in_flight_and_an_ended_one_is_counted_ok(epp) -> None:
    _, client, scrape = await epp()
    call = client.open()
    await call.write(request_headers())
    await scrape_until(scrape, lambda s: value(s, FAMILIES[0]) == 1, "the open stream is not in flight")
    await call.done_writing()  # Envoy half-closes the stream: the handler returns, grpc status OK
    async for _ in call:
        pass
    assert await call.code() == grpc.StatusCode.OK
    samples = await scrape_until(scrape, lambda s: completed(s, "OK") == 1, "the stream was not counted")
    assert value(samples, FAMILIES[0]) == 0
    assert value(samples, FAMILIES[1] + "_count") == 1 and value(samples, FAMILIES[1] + "_sum") > 0
    assert value(samples, FAMILIES[1] + "_bucket", le="+Inf") == 1


async def test_a_cancelled_stream_leaves_flight(epp, transport: str) -> None:
    _, client, scrape = await epp()
    call = client.open()
    await call.write(request_headers())
    await scrape_until(scrape, lambda s: value(s, FAMILIES[0]) == 1, "the open stream is not in flight")
    call.cancel()  # Envoy resets the stream (the downstream client went away)
    # As the reference's handler (it returns the stream context's error): Unknown. grpc.aio hands EPP a reset
    # while it waits for a message as the end of the request stream, so that transport records OK.
    code = "Unknown" if transport == "native" else "OK"
    samples = await scrape_until(scrape, lambda s: completed(s, code) == 1, "the cancelled stream was not counted")
    assert value(samples, FAMILIES[0]) == 0 and value(samples, FAMILIES[1] + "_count") == 1


async def test_a_protocol_violation_is_counted_with_its_status(epp) -> None:
    _, client, scrape = await epp()
    call = client.open_raw()
    await call.write(b"\xff\xff not a ProcessingRequest")
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        async for _ in call:
            pass
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    samples = await scrape_until(scrape, lambda s: completed(s, "InvalidArgument") == 1, "the aborted stream")
    assert value(samples, FAMILIES[0]) == 0


async def test_other_workers_streams_reach_worker_zero(tmp_path: Path) -> None:
    registries = [CollectorRegistry() for _ in range(2)]
    meters = [StreamMetrics(r) for r in registries]
    links = [PeerLink(i, 2, tmp_path / "mesh", period=0.01, metrics_period=0.02) for i in range(2)]
    for link, meter in zip(links, meters):
        link.attach(make_director(specs(1)), meter.families())
        await link.start()
    try:
        meters[1].finished(0, meters[1].started())
        meters[1].started()  # still open
        meters[0].finished(0, meters[0].started())
        await eventually(lambda: registries[0].get_sample_value("llm_d_epp_extproc_streams_total", {"code": "OK"}) == 2,
                         "worker 1's streams reaching worker 0")

        assert registries[0].get_sample_value(FAMILIES[0]) == 1
        assert registries[0].get_sample_value(FAMILIES[1] + "_count") == 2
    finally:
        for link in links:
            await link.stop()
