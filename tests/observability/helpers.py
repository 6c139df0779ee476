"""What the observability tests share: an EPP with tracing into an in-memory exporter, simulated servers behind
header taps (the headers each model server received), and reading the span tree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from epp.config.loader import DEFAULT_CONFIG_TEXT
from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimServer

from ..conftest import Servers

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@dataclass
class Tap:
    """A relay in front of one model server recording the headers of each inference request (POST) it passes on;
    ``/metrics`` and the rest pass through unrecorded."""

    target: str
    records: list[dict[str, str]] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._session = aiohttp.ClientSession()
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _relay(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if request.method == "POST":
            self.records.append({k.lower(): v for k, v in request.headers.items()})
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length", "transfer-encoding")}
        async with self._session.request(request.method, self.target + request.path_qs, data=raw,
                                         headers=headers) as up:
            return web.Response(status=up.status, body=await up.read(),
                                headers={"Content-Type": up.headers.get("Content-Type", "application/json")})


async def tapped_sims(servers: Servers, n: int = 2) -> list[Tap]:
    """``n`` simulators serving model ``m``, each behind a :class:`Tap` (its port is the endpoint's)."""
    taps = []
    for i in range(n):
        sim = await servers.start(SimServer(SimConfig(model="m", time_scale=0.01, seed=i)))
        taps.append(await servers.start(Tap(sim.url)))
    return taps


def endpoints(taps: list[Tap]) -> list[EndpointSpec]:
    return [EndpointSpec(name=f"sim{i}", address="127.0.0.1", port=t.port) for i, t in enumerate(taps)]


async def traced_epp(servers: Servers, taps: list[Tap], exporter: InMemorySpanExporter | None, **kw: Any) -> EppApp:
    """An EPP over ``taps`` (``exporter``: tracing at ratio 1 into it; None: tracing off), ports from ``kw``."""
    options = ServeOptions(config_text=DEFAULT_CONFIG_TEXT, host="127.0.0.1", grpc_port=None, health_port=None,
                           metrics_port=None, plaintext=True, endpoints=endpoints(taps))
    if exporter is not None:
        options.tracing, options.tracing_sampling_ratio = True, 1.0
        options.span_processor = SimpleSpanProcessor(exporter)
    for key, value in kw.items():
        setattr(options, key, value)
    return await servers.start(EppApp(options))


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def one(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> ReadableSpan:
    found = by_name(spans, name)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def traceparent_ids(value: str) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C ``traceparent`` value."""
    version, trace_id, span_id, flags = value.split("-")
    assert version == "00" and len(flags) == 2
    return trace_id, span_id
