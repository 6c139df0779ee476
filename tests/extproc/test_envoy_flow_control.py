"""EPP's flow-control queue behind a real Envoy in BUFFERED mode: `epp envoy-config --config` sizes Envoy's ext_proc
message timeout for the queue, so a request that waits out its TTL gets EPP's 429, not Envoy's 504.

In BUFFERED mode EPP answers the request body only once flow control admitted the request; Envoy's default 5 s
``message_timeout`` used to end a longer wait with an empty 504 (and, with fail-open, send the request to the
fallback endpoints past flow control). The TTL here (6 s) is just above those 5 s, so the test needs that long.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

from epp.cli.envoy import queue_wait
from epp.envoy.bootstrap import EnvoyConfigOptions, build_bootstrap
from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EppApp, ServeOptions

from ..conftest import eventually
from .envoy_harness import EnvoyProcess

pytestmark = pytest.mark.envoy

CONFIG = """\
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters: {maxConcurrency: 1}
saturationDetector: {pluginRef: concurrency-detector}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
flowControl:
  defaultRequestTTL: 6s
  noEndpointRequestTTL: 6s
"""

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


class HoldServer:
    """An upstream whose inference requests are answered only once :attr:`release` is set; :attr:`arrived` counts
    them. ``/metrics`` answers at once (nothing to report)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.arrived = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        if request.path == "/metrics":
            return web.Response(text="")
        await request.read()
        self.arrived += 1
        await self.release.wait()
        return web.json_response({"id": "x", "model": "m", "choices": [],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def upstream() -> AsyncIterator[HoldServer]:
    server = HoldServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def epp(tmp_path: Path, upstream: HoldServer) -> AsyncIterator[tuple[EppApp, Path]]:
    config = tmp_path / "epp.yaml"
    config.write_text(CONFIG)
    app = EppApp(ServeOptions(config=str(config), host="127.0.0.1", grpc_port=0, health_port=None,
                              metrics_port=None, plaintext=True, refresh_interval=None,
                              endpoints=[EndpointSpec(name="s0", address="127.0.0.1", port=upstream.port)]))
    await app.start()
    yield app, config
    await app.stop()


async def queued_answer(envoy_bin: Path, tmp_path: Path, opts: EnvoyConfigOptions,
                        upstream: HoldServer) -> tuple[int, bytes, str | None]:
    """Through Envoy with ``opts``: one request holds the pool's only slot, a second one waits in EPP's queue;
    returns the second one's status, body and x-llm-d-request-dropped-reason header."""
    envoy = EnvoyProcess(envoy_bin, build_bootstrap(opts), tmp_path)
    await asyncio.to_thread(envoy.start)
    url = f"http://127.0.0.1:{envoy.port}/v1/chat/completions"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            first = asyncio.create_task(session.post(url, json=CHAT))
            await eventually(lambda: upstream.arrived == 1)
            async with session.post(url, json=CHAT) as queued:
                status, body = queued.status, await queued.read()
                dropped = queued.headers.get("x-llm-d-request-dropped-reason")
            upstream.release.set()
            (await first).close()
    finally:
        envoy.stop()
    return status, body, dropped


def options(app: EppApp, **kwargs: object) -> EnvoyConfigOptions:
    assert app.extproc is not None
    return EnvoyConfigOptions(listen="127.0.0.1:0", epp=(f"127.0.0.1:{app.extproc.port}",), plaintext=True,
                              admin="127.0.0.1:0", **kwargs)  # type: ignore[arg-type]


async def test_a_request_queued_past_its_ttl_gets_epps_429_through_buffered_envoy(
        envoy_bin: Path, tmp_path: Path, epp: tuple[EppApp, Path], upstream: HoldServer) -> None:
    app, config = epp
    opts = options(app, mode="buffered", queue_wait_s=queue_wait(str(config)))
    assert opts.queue_wait_s == 6.0 and opts.message_timeout > 6.0 and not opts.warnings()
    status, body, dropped = await queued_answer(envoy_bin, tmp_path, opts, upstream)
    assert status == 429, body  # EPP's backpressure answer (the pool has endpoints), not Envoy's 504 at 5 s
    assert orjson.loads(body)["error"]["code"] == "request_ttl_expired" and dropped == "rejected-ttl-expired"


async def test_an_idle_timeout_shorter_than_the_queue_ends_the_wait_as_the_warning_says(
        envoy_bin: Path, tmp_path: Path, epp: tuple[EppApp, Path], upstream: HoldServer) -> None:
    # A queued request moves no byte: Envoy's stream idle timeout (not the request timeout) is what ends it.
    app, config = epp
    opts = options(app, queue_wait_s=queue_wait(str(config)), idle_timeout_s=2, request_timeout_s=1)
    assert "504 'stream timeout'" in " ".join(opts.warnings())
    status, body, dropped = await queued_answer(envoy_bin, tmp_path, opts, upstream)
    assert (status, dropped) == (504, None)  # Envoy's answer, in JSON since `epp envoy-config` maps local replies
    assert orjson.loads(body)["error"]["message"] == "stream timeout (stream_idle_timeout)"
