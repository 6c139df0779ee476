"""``requestHandler.parsers`` through the real ext_proc server: each request is read by the parser its path picks
(OpenAI and Anthropic bodies with the reference README's config; gRPC and JSON bodies on one EPP), the chosen
parser's reader reads the response usage, an unclaimed path is the reference's 400, and the fallback parser
takes the paths no other claims."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from epp._pb.engines import vllm_engine_pb2 as vllm
from epp.extproc.protocol import pb

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

README = (Path(__file__).parents[1] / "fixtures/configs/llmd/router_parsers-readme.yaml").read_text()
OPENAI_AND_ANTHROPIC = README.split("\n---\n")[2]  # the README's "Configuration with multiple parsers"
GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
GRPC_HEADERS = {"content-type": "application/grpc", "te": "trailers"}
GRPC_AND_OPENAI = """
plugins:
- {type: vllmgrpc-parser, name: grpc}
- {type: openai-parser, name: http}
requestHandler:
  parsers: [{pluginRef: grpc}, {pluginRef: http}]
"""


def frame(message: Any) -> bytes:
    raw = message.SerializeToString()
    return b"\x00" + len(raw).to_bytes(4, "big") + raw


def routed_to(first: pb.ProcessingResponse) -> str:
    assert first.WhichOneof("response") == "request_headers", first
    return set_headers(first.request_headers.response)["x-gateway-destination-endpoint"]


async def test_the_readme_config_sends_each_api_to_its_parser(serve) -> None:
    """openai-parser alone refuses a ``/v1/messages/count_tokens`` body without ``messages``; in the list the path
    goes to anthropic-parser, which reads only the envelope (the model)."""
    _, client = await serve(make_director(specs(2), OPENAI_AND_ANTHROPIC))
    count = orjson.dumps({"model": "claude"})
    first, forwarded = await route_body(client, "/v1/messages/count_tokens", count)
    assert routed_to(first) and forwarded == count
    chat = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}]})
    first, _ = await route_body(client, "/v1/chat/completions", chat)
    assert routed_to(first)
    first, _ = await route_body(client, "/v1/models", chat)
    assert first.immediate_response.status.code == 400
    assert b"no parser registered matching path suffix for: /v1/models" in first.immediate_response.body


async def test_grpc_and_json_bodies_on_one_epp(serve) -> None:
    """A gRPC frame is no JSON and JSON is no gRPC frame: each routes only because its own parser read it."""
    _, client = await serve(make_director(specs(3), GRPC_AND_OPENAI))
    generate = frame(vllm.GenerateRequest(request_id="r", tokenized=vllm.TokenizedInput(input_ids=[1, 2, 3])))
    first, forwarded = await route_body(client, GENERATE, generate, GRPC_HEADERS)
    assert routed_to(first) and forwarded == generate
    completion = orjson.dumps({"model": "m", "prompt": "hello"})
    first, forwarded = await route_body(client, "/v1/completions", completion)
    assert routed_to(first) and forwarded == completion


async def test_the_response_usage_is_read_by_the_parser_that_read_the_request(serve) -> None:
    rec = Recorder()
    _, client = await serve(make_director(specs(1), GRPC_AND_OPENAI, metrics=rec))
    call = client.open()
    await call.write(request_headers(GENERATE, GRPC_HEADERS))
    await call.write(request_body(frame(vllm.GenerateRequest(text="hello"))))
    await call.read(), await call.read()
    await call.write(response_headers(content_type="application/grpc"))
    await call.read()
    await call.write(response_body(frame(vllm.GenerateResponse(complete=vllm.GenerateComplete(
        finish_reason="stop", prompt_tokens=4, completion_tokens=3, cached_tokens=1))), eos=True))
    await call.read()
    call.cancel()
    assert rec.tokens == [("", "", 4, 3, 1)]  # the vLLM gRPC reader's fields, not OpenAI's JSON usage


async def test_the_fallback_parser_takes_the_paths_no_other_claims(serve) -> None:
    config = """
plugins: [{type: openai-parser}, {type: passthrough-parser}]
requestHandler: {parsers: [{pluginRef: openai-parser}, {pluginRef: passthrough-parser}]}
"""
    _, client = await serve(make_director(specs(2), config))
    raw = b"\x89PNG not json"
    first, _ = await route_body(client, "/v1/chat/completions", raw)
    assert first.immediate_response.status.code == 400  # openai-parser's: the body is not JSON
    first, forwarded = await route_body(client, "/v1/videos/video-123/content", raw)
    assert routed_to(first) and forwarded == raw
