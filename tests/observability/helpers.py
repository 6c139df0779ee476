"""What the observability tests share: an EPP with tracing into an in-memory exporter, simulated servers behind
header taps (the headers each model server received), and reading the span tree."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from epp.config.loader import DEFAULT_CONFIG_TEXT
from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimServer

from ..conftest import Servers
from ..gateway.helpers import Tap

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def posted(tap: Tap) -> list[dict[str, str]]:
    """The headers of each inference request (POST) ``tap`` passed on, oldest first (scrapes left out)."""
    return [r.headers for r in tap.records if r.path.startswith("/v1/")]


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
