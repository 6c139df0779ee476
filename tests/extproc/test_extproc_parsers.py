"""The model-server-native parsers end to end: Vertex AI and vLLM gRPC bodies routed through EPP's ext_proc server
over a pool of simulators, and a real gRPC client through Envoy and EPP to gRPC upstreams."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from epp._pb.engines import vertexai_pb2 as vertex
from epp._pb.engines import vllm_engine_pb2 as vllm
from epp.cli.envoy import claimed_suffixes
from epp.extproc.protocol import pb
from epp.framework.endpoint import EndpointSpec
from epp.headers import MODEL_REWRITE_HEADER, HeaderTrust

from .helpers import (
    Recorder,
    make_director,
    request_body,
    request_headers,
    response_body,
    response_headers,
    route_body,
    set_headers,
    specs,
)

CHAT_METHOD = "/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions"
GRPC_HEADERS = {"content-type": "application/grpc", "te": "trailers"}
PREFIX = "You are a careful assistant. " * 80  # ~2.3 KB shared system prompt, many prefix blocks


def sim_specs(servers: list[Any]) -> list[EndpointSpec]:
    return [EndpointSpec(name=f"sim{i}", address=s.host, port=s.port) for i, s in enumerate(servers)]


def config(parser: str) -> str:
    return f"""
plugins:
- type: {parser}
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: prefix-cache-scorer}}, {{pluginRef: max-score-picker}}]
parser:
  pluginRef: {parser}
"""


def frame(message: Any) -> bytes:
    raw = message.SerializeToString()
    return b"\x00" + len(raw).to_bytes(4, "big") + raw


def vertex_chat(system: str, question: str, model: str = "gemma") -> bytes:
    data = (b'{"model":"%s","stream":false,"messages":[{"role":"system","content":"%s"},'
            b'{"role":"user","content":"%s"}]}' % (model.encode(), system.encode(), question.encode()))
    return frame(vertex.ChatCompletionsRequest(endpoint="projects/p/locations/l/endpoints/e",
                                               http_body=vertex.HttpBody(content_type="application/json", data=data)))


async def route(client: Any, path: str, body: bytes, headers: dict[str, str] | None = None
                ) -> tuple[pb.ProcessingResponse, bytes]:
    """One request through the ext_proc stream: the routing reply and the request body EPP sends upstream."""
    return await route_body(client, path, body, {**GRPC_HEADERS, **(headers or {})})


async def test_vertex_requests_are_routed_by_their_wrapped_prompt_and_forwarded_byte_for_byte(
        serve, sims, scraped) -> None:
    servers = await sims(3)
    director = make_director(sim_specs(servers), config("vertexai-parser"))
    await scraped(director)
    _, client = await serve(director)
    pool = {f"{s.host}:{s.port}" for s in servers}
    for i in range(3):
        system = f"{i} {PREFIX}"  # one long shared prefix per conversation
        picked = []
        for question in ("first question", "second question"):
            body = vertex_chat(system, question)
            first, forwarded = await route(client, CHAT_METHOD, body)
            headers = set_headers(first.request_headers.response)
            picked.append(headers["x-gateway-destination-endpoint"])
            assert forwarded == body and headers["content-length"] == str(len(body))  # the gRPC frame, unchanged
        assert picked[0] in pool and picked[1] == picked[0]  # the second turn follows the first's prefix


@pytest.mark.parametrize("parser,path,body,message", [
    ("vertexai-parser", CHAT_METHOD, b"\x00\x00\x00", "invalid gRPC frame"),
    ("vertexai-parser", CHAT_METHOD, frame(vertex.ChatCompletionsRequest()), "ChatCompletionsRequest has no HttpBody"),
    ("vllmgrpc-parser", "/vllm.grpc.engine.VllmEngine/Generate", frame(vllm.GenerateRequest()),
     "not supported request inputType"),
], ids=["vertex-short-frame", "vertex-no-http-body", "vllm-no-input"])
async def test_bad_grpc_bodies_get_a_400_immediate_response(serve, parser: str, path: str, body: bytes,
                                                            message: str) -> None:
    _, client = await serve(make_director(specs(2), config(parser)))
    first, _ = await route(client, path, body)
    assert first.immediate_response.status.code == 400
    assert message in first.immediate_response.body.decode()


async def test_tokenized_vllm_generate_requests_are_routed_by_their_token_ids_and_forwarded_unchanged(serve) -> None:
    director = make_director(specs(4), config("vllmgrpc-parser"))
    _, client = await serve(director)
    for i in range(3):
        body = frame(vllm.GenerateRequest(request_id="r", tokenized=vllm.TokenizedInput(
            input_ids=[i, *range(1000, 1400)]), sampling_params=vllm.SamplingParams(max_tokens=8)))
        picks = set()
        for _ in range(2):
            first, forwarded = await route(client, "/vllm.grpc.engine.VllmEngine/Generate", body)
            picks.add(set_headers(first.request_headers.response)["x-gateway-destination-endpoint"])
            assert forwarded == body
        assert len(picks) == 1  # the token ids were hashed into prefix blocks: the repeat follows the first


async def test_a_rewritten_target_model_leaves_a_grpc_body_unchanged(serve) -> None:
    trust = HeaderTrust([MODEL_REWRITE_HEADER])  # the rewrite comes from a trusted gateway
    _, client = await serve(make_director(specs(1), config("vertexai-parser"), header_trust=trust))
    body = vertex_chat("sys", "question", model="gemma")
    _, forwarded = await route(client, CHAT_METHOD, body, {"x-llm-d-router-model-name-rewrite": "gemma-2b"})
    assert forwarded == body


async def test_grpc_response_usage_is_read_with_the_parsers_reader(serve) -> None:
    rec = Recorder()
    _, client = await serve(make_director(specs(1), config("vllmgrpc-parser"), metrics=rec))
    call = client.open()
    await call.write(request_headers("/vllm.grpc.engine.VllmEngine/Generate", GRPC_HEADERS))
    await call.write(request_body(frame(vllm.GenerateRequest(text="hello"))))
    await call.read(), await call.read()
    await call.write(response_headers(content_type="application/grpc"))
    await call.read()
    stream = (frame(vllm.GenerateResponse(chunk=vllm.GenerateStreamChunk(token_ids=[7]))) +
              frame(vllm.GenerateResponse(complete=vllm.GenerateComplete(
                  finish_reason="stop", prompt_tokens=2, completion_tokens=1, cached_tokens=0))))
    await call.write(response_body(stream[:9], eos=False))
    await call.read()
    await call.write(response_body(stream[9:], eos=True))
    await call.read()
    call.cancel()
    assert rec.tokens == [("", "", 2, 1, 0)]


# -- a real gRPC client through Envoy and EPP to gRPC upstreams ----------------------------------------------

class VertexUpstream:
    """A gRPC server answering PredictionService/ChatCompletions with one HttpBody holding an OpenAI reply; it
    keeps the requests it got."""

    def __init__(self) -> None:
        self.requests: list[vertex.ChatCompletionsRequest] = []
        self.server = grpc.aio.server()
        handler = grpc.unary_stream_rpc_method_handler(
            self._chat, request_deserializer=vertex.ChatCompletionsRequest.FromString,
            response_serializer=vertex.HttpBody.SerializeToString)
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "google.cloud.aiplatform.v1beta1.PredictionService", {"ChatCompletions": handler})])
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def _chat(self, request: vertex.ChatCompletionsRequest, context: Any):  # type: ignore[no-untyped-def]
        self.requests.append(request)
        yield vertex.HttpBody(content_type="application/json", data=(
            b'{"object":"chat.completion","choices":[{"message":{"role":"assistant","content":"ok"}}],'
            b'"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}'))


def http2_upstreams(bootstrap: dict[str, Any]) -> None:
    """Envoy speaks HTTP/2 (prior knowledge) to the pool: gRPC upstreams."""
    for cluster in bootstrap["static_resources"]["clusters"]:
        if cluster["type"] == "ORIGINAL_DST":
            cluster["typed_extension_protocol_options"] = {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}}}


@pytest.mark.envoy
async def test_a_vertex_grpc_call_through_envoy_reaches_the_upstream_epp_picked(stack) -> None:
    upstreams = [VertexUpstream() for _ in range(3)]
    await asyncio.gather(*(u.server.start() for u in upstreams))
    sent = []
    try:
        pool = [EndpointSpec(name=f"vertex{i}", address="127.0.0.1", port=u.port) for i, u in enumerate(upstreams)]
        director = make_director(pool, config("vertexai-parser"))  # Envoy routes its paths, as with --config
        st = await stack(director, tweak=http2_upstreams, suffixes=claimed_suffixes(director.pipeline))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{st.envoy.port}") as channel:
            call = channel.unary_stream(CHAT_METHOD, request_serializer=lambda b: b[5:],
                                        response_deserializer=vertex.HttpBody.FromString)
            for i in range(3):
                for question in ("first question", "second question"):
                    sent.append(vertex_chat(f"{i} {PREFIX}", question))
                    replies = [r async for r in call(sent[-1])]
                    assert b'"usage":{"prompt_tokens":9' in replies[0].data
    finally:
        await asyncio.gather(*(u.server.stop(0) for u in upstreams))
    got = [(i, r) for i, u in enumerate(upstreams) for r in u.requests]
    assert sorted(r.SerializeToString() for _, r in got) == sorted(b[5:] for b in sent)  # each message intact
    for conversation in range(3):  # both turns of a conversation on the pod EPP picked for its prefix
        assert len({i for i, r in got if r.http_body.data.find(b'"content":"%d You' % conversation) > 0}) == 1
