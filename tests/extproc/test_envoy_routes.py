"""What reaches the pool through the bootstrap `epp envoy-config` writes, and what Envoy answers itself, with a real
Envoy in both request body modes and both pool cluster kinds.

* Only the paths EPP's parsers claim (POST), ``GET /v1/models`` and ``--allow-path`` paths are routed; every other
  path, the model servers' admin routes included, gets an OpenAI-style JSON 404 from Envoy without EPP being asked
  (Anthropic's envelope under ``/v1/messages``).
* EPP unreachable: a JSON 503 with ``retry-after``; EPP's own refusals pass unchanged; no model server reachable:
  a JSON 503 with ``retry-after`` naming Envoy's reason.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from epp.envoy.bootstrap import EnvoyConfigOptions, build_bootstrap
from epp.envoy.xds import XdsServer
from epp.extproc import ExtProcServer
from epp.framework.endpoint import EndpointSpec
from epp.scheduling.director import Director

from ..conftest import Servers
from .envoy_harness import EnvoyProcess
from .helpers import EchoServer, make_director

pytestmark = pytest.mark.envoy

MODES = pytest.mark.parametrize("mode", ["full-duplex", "buffered"])
LBS = pytest.mark.parametrize("lb", ["override-host", "original-dst"])
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ADMIN = [("POST", "/reset_prefix_cache"), ("POST", "/sleep?level=1"), ("POST", "/wake_up"), ("GET", "/metrics"),
         ("POST", "/collective_rpc"), ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter"),
         ("GET", "/health"), ("POST", "/tokenize"), ("GET", "/is_sleeping"), ("POST", "/v1/../sleep")]
UNKNOWN = [("GET", "/foo"), ("POST", "/v1/nothing"), ("GET", "/v1/chat/completions"), ("POST", "/v1/models"),
           ("POST", "/v1/chat/completions/extra"), ("DELETE", "/v1/responses")]


@dataclass
class XdsStack:
    """EPP (ext_proc, and EDS for override-host) and Envoy with the bootstrap `epp envoy-config` writes."""

    director: Director
    server: ExtProcServer
    xds: XdsServer
    envoy: EnvoyProcess
    asked: list[str] = field(default_factory=list)
    """What EPP was asked to route (its parser's and bodiless requests' calls), in order."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.envoy.port}"

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], bytes]:
        async with aiohttp.ClientSession() as session:
            async with session.request(method, self.url + path, data=orjson.dumps(body) if body else None,
                                       headers={"content-type": "application/json"}) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.read()


def spy_on(director: Director, asked: list[str]) -> None:
    """Record what EPP is asked: each body to parse (its path), and each draw of candidates ("(no body)": a
    bodiless request's, or a parsed request's scheduling)."""
    parse, candidates = director.parse, director.candidates

    def spy_parse(path, body, headers):  # type: ignore[no-untyped-def]
        asked.append(path)
        return parse(path, body, headers)

    def spy_candidates(subset):  # type: ignore[no-untyped-def]
        asked.append("(no body)")
        return candidates(subset)

    director.parse = spy_parse  # type: ignore[method-assign]
    director.candidates = spy_candidates  # type: ignore[method-assign,assignment]


@pytest.fixture
def xds_stack(envoy_bin: Path, tmp_path: Path, servers: Servers) -> Callable[..., Awaitable[XdsStack]]:
    """``await xds_stack(director, mode=..., lb=..., **EnvoyConfigOptions)``: a running :class:`XdsStack`; each
    upstream answer carries ``x-served-by`` (test-only)."""
    names = (f"envoy{i}" for i in itertools.count())

    async def factory(director: Director, mode: str = "full-duplex", lb: str = "override-host",
                      **options: Any) -> XdsStack:
        xds = await servers.start(XdsServer(director.datastore, host="127.0.0.1", port=0))
        server = ExtProcServer(director, host="127.0.0.1", port=0, health_port=None, plaintext=True)
        await server.start()
        servers.defer(lambda: server.stop(0))
        if lb == "override-host":
            options["xds"] = (f"127.0.0.1:{xds.port}",)
        opts = EnvoyConfigOptions(listen="127.0.0.1:0", admin="127.0.0.1:0", plaintext=True, mode=mode,  # type: ignore[arg-type]
                                  epp=(f"127.0.0.1:{server.port}",), lb=lb, **options)  # type: ignore[arg-type]
        boot = build_bootstrap(opts)
        hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
            if "route" in route:
                route["response_headers_to_add"] = [
                    {"header": {"key": "x-served-by", "value": "%UPSTREAM_REMOTE_ADDRESS%"}}]
        st = XdsStack(director, server, xds, EnvoyProcess(envoy_bin, boot, tmp_path, name=next(names)))
        spy_on(director, st.asked)
        servers.defer(st.envoy.stop)
        await asyncio.to_thread(st.envoy.start)
        return st

    return factory


@pytest.fixture
async def pool(servers: Servers) -> list[EchoServer]:
    """Two started echo servers; stopped after."""
    return [await servers.start(EchoServer()) for _ in range(2)]


def pool_director(echoes: list[EchoServer], config: str | None = None) -> Director:
    return make_director([EndpointSpec(name=f"echo{i}", address="127.0.0.1", port=e.port)
                          for i, e in enumerate(echoes)], config)


def not_found(answer: tuple[int, dict[str, str], bytes], method: str, path: str) -> None:
    status, headers, body = answer
    assert status == 404 and headers["content-type"] == "application/json", (status, headers, body)
    error = orjson.loads(body)["error"]
    assert error["type"] == "not_found_error" and error["code"] == "NotFound" and error["param"] is None
    assert error["message"] == f"no route for {method} {path.replace('/v1/..', '')}"


@MODES
@LBS
async def test_only_inference_paths_reach_the_pool_and_epp(xds_stack, pool, mode: str, lb: str) -> None:
    st = await xds_stack(pool_director(pool), mode, lb)
    for method, path in ADMIN + UNKNOWN:
        not_found(await st.call(method, path, CHAT if method == "POST" else None), method, path)
    assert st.asked == [] and sum(e.hits for e in pool) == 0  # neither EPP nor a model server saw any of them
    routed = [("/v1/chat/completions", CHAT), ("/v1/completions", {"model": "m", "prompt": "hi"}),
              ("/v1/embeddings", {"model": "m", "input": "hi"}), ("/v1/responses", {"model": "m", "input": "hi"}),
              ("/v1/messages", {**CHAT, "max_tokens": 4}), ("/v1/chat/completions/", CHAT),
              ("/v1/chat/completions?api-version=1", CHAT)]
    for path, body in routed:
        status, headers, _ = await st.call("POST", path, body)
        assert status == 200 and "x-served-by" in headers, path
    status, headers, _ = await st.call("GET", "/v1/models")
    assert status == 200 and "x-served-by" in headers and st.asked[-1] == "(no body)"
    assert [a for a in st.asked if a != "(no body)"] == [path for path, _ in routed]
    assert sum(e.hits for e in pool) == len(routed) + 1


@MODES
async def test_an_unknown_path_under_the_messages_api_gets_anthropics_envelope(xds_stack, pool, mode: str) -> None:
    st = await xds_stack(pool_director(pool), mode)
    status, headers, body = await st.call("GET", "/v1/messages")
    assert status == 404 and headers["content-type"] == "application/json"
    assert orjson.loads(body) == {"type": "error", "error": {"type": "not_found_error",
                                                             "message": "no route for GET /v1/messages"}}


async def test_allowed_paths_are_routed_through_epp_and_others_stay_closed(xds_stack, pool) -> None:
    st = await xds_stack(pool_director(pool), allow_paths=("/tokenize",))
    status, headers, _ = await st.call("POST", "/tokenize", {"model": "m", "prompt": "hi"})
    assert status == 200 and "x-served-by" in headers and st.asked[0] == "/tokenize"
    not_found(await st.call("POST", "/detokenize", {"model": "m", "tokens": [1]}), "POST", "/detokenize")


@MODES
@LBS
async def test_epp_down_is_a_json_503_to_retry(xds_stack, pool, mode: str, lb: str) -> None:
    st = await xds_stack(pool_director(pool), mode, lb)
    await st.server.stop(0)
    for method, path, body in [("POST", "/v1/chat/completions", CHAT), ("GET", "/v1/models", None)]:
        status, headers, raw = await st.call(method, path, body)
        assert status == 503 and headers["retry-after"] == "1" and headers["content-type"] == "application/json"
        error = orjson.loads(raw)["error"]
        assert error["type"] == "server_error" and error["code"] == "ServiceUnavailable"
        assert error["message"].startswith("the endpoint picker (EPP) is unavailable (ext_proc_error")
    status, headers, raw = await st.call("POST", "/v1/messages", {**CHAT, "max_tokens": 4})
    answer = orjson.loads(raw)
    assert status == 503 and headers["retry-after"] == "1" and answer["type"] == "error"
    assert answer["error"]["type"] == "overloaded_error" and "endpoint picker" in answer["error"]["message"]
    assert sum(e.hits for e in pool) == 0


@MODES
async def test_epps_own_answers_pass_unchanged(xds_stack, pool, mode: str) -> None:
    st = await xds_stack(pool_director(pool), mode)
    status, headers, body = await st.call("POST", "/v1/chat/completions", {"messages": []})
    assert status == 400 and "retry-after" not in headers
    assert orjson.loads(body) == {"error": {"message": "model not found in request body", "type":
                                            "invalid_request_error", "param": "model", "code": "BadRequest"}}
    status, _, body = await st.call("POST", "/v1/messages", {"messages": []})
    assert status == 400 and orjson.loads(body)["type"] == "error"  # EPP's Anthropic envelope, key order kept
    assert body.startswith(b'{"type":"error"')


@MODES
async def test_no_reachable_model_server_is_a_json_503_to_retry(xds_stack, pool, mode: str) -> None:
    st = await xds_stack(pool_director(pool), mode)
    for echo in pool:
        await echo.stop()
    status, headers, body = await st.call("POST", "/v1/chat/completions", CHAT)
    assert status == 503 and headers["retry-after"] == "1", body
    error = orjson.loads(body)["error"]
    assert error["code"] == "ServiceUnavailable" and "upstream_reset_before_response_started" in error["message"]
    assert st.envoy.stats("cluster.inference-pool.upstream_rq_retry")[
        "cluster.inference-pool.upstream_rq_retry"] >= 1  # every member was tried before giving up
