"""OpenTelemetry spans of one request through each front end, collected with the SDK's in-memory exporter: the
tree (a SERVER root, admission, scheduling with a span per profile run carrying its scorers' scores, the upstream
call), its attributes, and W3C ``traceparent`` propagation from the client to the model server (a recording tap in
front of each simulator shows what the model server received), the gateway directly and ext_proc through a real
Envoy. A malformed ``traceparent`` starts a new trace; with tracing off no observer exists at all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from epp.envoy.bootstrap import EnvoyConfigOptions, build_bootstrap

from ..conftest import Servers, eventually
from ..extproc.envoy_harness import EnvoyProcess
from .helpers import (
    BODY,
    CLIENT_SPAN,
    TRACE_ID,
    TRACEPARENT,
    Tap,
    one,
    parent_id,
    posted,
    tapped_sims,
    traced_epp,
    traceparent_ids,
)

SCORERS = ("queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


def check_tree(exporter: InMemorySpanExporter, taps: list[Tap], front_end: str) -> None:
    """One request's spans: their tree, attributes, and the traceparent the chosen model server received."""
    spans = exporter.get_finished_spans()
    root = one(spans, "gateway.request")
    assert root.kind is SpanKind.SERVER
    assert format(root.context.trace_id, "032x") == TRACE_ID and parent_id(root) == int(CLIENT_SPAN, 16)
    assert {format(s.context.trace_id, "032x") for s in spans} == {TRACE_ID}
    attrs = root.attributes or {}
    assert attrs["epp.front_end"] == front_end and attrs["gen_ai.request.model"] == "m"
    assert attrs["http.response.status_code"] == 200 and attrs["epp.profile.primary"] == "default"
    admission, scheduling = one(spans, "epp.admission"), one(spans, "epp.scheduling")
    assert parent_id(admission) == parent_id(scheduling) == root.context.span_id
    profile = one(spans, "epp.scheduling.profile")
    assert parent_id(profile) == scheduling.context.span_id
    p = profile.attributes or {}
    assert p["epp.profile.name"] == "default" and p["epp.profile.candidates"] == len(taps)
    chosen = attrs["epp.endpoint"]
    assert list(p["epp.profile.picked"])[0] == chosen  # type: ignore[arg-type]
    for scorer in SCORERS:  # every candidate's score, best first, as ip:port=score
        scores = list(p[f"epp.scorer.{scorer}.scores"])  # type: ignore[arg-type]
        assert sorted(s.split("=")[0] for s in scores) == sorted(t.hostport for t in taps)
        values = [float(s.split("=")[1]) for s in scores]
        assert values == sorted(values, reverse=True) and all(0.0 <= v <= 1.0 for v in values)
        assert p[f"epp.scorer.{scorer}.weight"] > 0  # type: ignore[operator]
    upstream = one(spans, "epp.upstream")
    assert upstream.kind is SpanKind.CLIENT and parent_id(upstream) == root.context.span_id
    assert (upstream.attributes or {})["server.address"] == chosen
    [tap] = [t for t in taps if t.hostport == chosen]
    assert traceparent_ids(posted(tap)[-1]["traceparent"]) == (TRACE_ID, format(upstream.context.span_id,
                                                                                         "016x"))
    assert not any(posted(t) for t in taps if t is not tap)


async def test_gateway_request_span_tree_and_traceparent_to_the_model_server(
        servers: Servers, session: aiohttp.ClientSession) -> None:
    taps = await tapped_sims(servers)
    exporter = InMemorySpanExporter()
    app = await traced_epp(servers, taps, exporter, http_port=0)
    async with session.post(f"http://127.0.0.1:{app.gateway.port}/v1/chat/completions", json=BODY,
                            headers={"traceparent": TRACEPARENT}) as resp:
        assert resp.status == 200, await resp.text()
    check_tree(exporter, taps, "gateway")


@pytest.mark.envoy
async def test_extproc_request_through_envoy_span_tree_and_traceparent_to_the_model_server(
        envoy_bin: Path, tmp_path: Path, servers: Servers, session: aiohttp.ClientSession) -> None:
    taps = await tapped_sims(servers)
    exporter = InMemorySpanExporter()
    app = await traced_epp(servers, taps, exporter, grpc_port=0, xds_port=0)
    envoy = EnvoyProcess(envoy_bin, build_bootstrap(EnvoyConfigOptions(
        listen="127.0.0.1:0", admin="127.0.0.1:0", plaintext=True, epp=(f"127.0.0.1:{app.extproc.port}",),
        lb="override-host", xds=(f"127.0.0.1:{app.xds.port}",))), tmp_path)
    servers.defer(envoy.stop)
    await asyncio.to_thread(envoy.start)
    async with session.post(f"http://127.0.0.1:{envoy.port}/v1/chat/completions", json=BODY,
                            headers={"traceparent": TRACEPARENT}) as resp:
        assert resp.status == 200, await resp.text()
    # The stream ends after the client has its answer: the root span ends with it.
    await eventually(lambda: any(s.name == "gateway.request" for s in exporter.get_finished_spans()))
    check_tree(exporter, taps, "extproc")
    root = one(exporter.get_finished_spans(), "gateway.request")
    assert [e.name for e in root.events] == ["response_headers", "first_byte"]


@pytest.mark.parametrize("traceparent", ["garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                                         "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"])
async def test_a_malformed_traceparent_is_ignored_and_a_new_trace_starts(
        servers: Servers, session: aiohttp.ClientSession, traceparent: str) -> None:
    taps = await tapped_sims(servers, 1)
    exporter = InMemorySpanExporter()
    app = await traced_epp(servers, taps, exporter, http_port=0)
    async with session.post(f"http://127.0.0.1:{app.gateway.port}/v1/chat/completions", json=BODY,
                            headers={"traceparent": traceparent}) as resp:
        assert resp.status == 200, await resp.text()
    root = one(exporter.get_finished_spans(), "gateway.request")
    assert root.parent is None
    trace_id, _ = traceparent_ids(posted(taps[0])[-1]["traceparent"])
    assert trace_id == format(root.context.trace_id, "032x") != TRACE_ID


async def test_the_client_sampled_flag_wins_over_a_zero_ratio(servers: Servers, session: aiohttp.ClientSession) -> None:
    """parentbased_traceidratio: a sampled parent is followed at ratio 0; an unsampled one is not sampled, yet its
    trace id still goes upstream (the model server joins the client's trace either way)."""
    taps = await tapped_sims(servers, 1)
    exporter = InMemorySpanExporter()
    app = await traced_epp(servers, taps, exporter, http_port=0, tracing_sampling_ratio=0.0)
    url = f"http://127.0.0.1:{app.gateway.port}/v1/chat/completions"
    async with session.post(url, json=BODY, headers={"traceparent": TRACEPARENT}) as resp:
        assert resp.status == 200
    async with session.post(url, json=BODY) as resp:  # a new trace at ratio 0: not sampled
        assert resp.status == 200
    assert [s.name for s in exporter.get_finished_spans()].count("gateway.request") == 1
    unsampled = TRACEPARENT[:-2] + "00"
    exporter.clear()
    async with session.post(url, json=BODY, headers={"traceparent": unsampled}) as resp:
        assert resp.status == 200
    assert exporter.get_finished_spans() == ()
    trace_id, _ = traceparent_ids(posted(taps[0])[-1]["traceparent"])
    assert trace_id == TRACE_ID and posted(taps[0])[-1]["traceparent"].endswith("-00")


async def test_a_refused_request_ends_its_root_span_with_the_error(
        servers: Servers, session: aiohttp.ClientSession) -> None:
    taps = await tapped_sims(servers, 1)
    exporter = InMemorySpanExporter()
    app = await traced_epp(servers, taps, exporter, http_port=0)
    async with session.post(f"http://127.0.0.1:{app.gateway.port}/v1/chat/completions", data=b"{not json",
                            headers={"content-type": "application/json"}) as resp:
        assert resp.status == 400
    root = one(exporter.get_finished_spans(), "gateway.request")
    assert root.status.status_code is StatusCode.ERROR
    assert (root.attributes or {})["http.response.status_code"] == 400
    assert not posted(taps[0])


async def test_tracing_off_builds_no_observer(servers: Servers, session: aiohttp.ClientSession) -> None:
    """Off, the Director has no observer: every request-path hook is skipped by its one ``is not None`` test, so
    no span, context or attribute dict is made (and routing still works)."""
    taps = await tapped_sims(servers, 1)
    app = await traced_epp(servers, taps, None, http_port=0)
    assert app.director is not None and app.director.observer is None
    async with session.post(f"http://127.0.0.1:{app.gateway.port}/v1/chat/completions", json=BODY,
                            headers={"traceparent": TRACEPARENT}) as resp:
        assert resp.status == 200
    # Nothing of EPP's in between: the client's own traceparent reaches the model server unchanged.
    assert posted(taps[0])[-1]["traceparent"] == TRACEPARENT


async def test_a_request_no_endpoint_can_take_fails_its_scheduling_span(
        servers: Servers, session: aiohttp.ClientSession) -> None:
    exporter = InMemorySpanExporter()
    app = await traced_epp(servers, [], exporter, http_port=0)  # an empty pool: 503
    async with session.post(f"http://127.0.0.1:{app.gateway.port}/v1/chat/completions", json=BODY) as resp:
        assert resp.status == 503
    spans = exporter.get_finished_spans()
    root, scheduling = one(spans, "gateway.request"), one(spans, "epp.scheduling")
    assert parent_id(scheduling) == root.context.span_id
    assert root.status.status_code is scheduling.status.status_code is StatusCode.ERROR
    assert (root.attributes or {})["http.response.status_code"] == 503 and (root.attributes or {})["error.type"]
    assert not [s for s in spans if s.name == "epp.upstream"]
