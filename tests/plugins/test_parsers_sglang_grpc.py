"""sglanggrpc-parser: the reference's sglanggrpc_test.go cases (TextGenerate requests, meta_info usage)."""

from __future__ import annotations

import pytest

from epp._pb.engines import sglang_pb2 as pb
from epp.errors import BadRequest
from epp.framework.request import ApiKind
from epp.plugins.parsers.sglang_grpc import TEXT_GENERATE_PATH
from epp.usage import NO_USAGE

from .parsers import frame, parser


@pytest.mark.parametrize("message,expected", [
    (pb.TextGenerateRequest(text="Hello world"),
     dict(api=ApiKind.COMPLETIONS, prompt_text="Hello world", input_tokens=2, stream=False, max_tokens=None)),
    (pb.TextGenerateRequest(text="Hello world", stream=True), dict(prompt_text="Hello world", stream=True)),
    (pb.TextGenerateRequest(text="x", sampling_params=pb.SamplingParams(max_new_tokens=64)), dict(max_tokens=64)),
    (pb.TextGenerateRequest(text="x", sampling_params=pb.SamplingParams(max_new_tokens=-1)), dict(max_tokens=None)),
], ids=["text", "stream", "max-new-tokens", "negative-max-new-tokens"])
def test_text_generate_requests_are_read_from_the_proto(message: object, expected: dict) -> None:
    body = frame(message)
    r = parser("sglanggrpc-parser").parse(TEXT_GENERATE_PATH, body, {"x-llm-d-router-model-name-rewrite": "qwen"})
    assert {k: getattr(r, k) for k in expected} == expected
    assert (r.model, r.model_rewritable, r.body_size) == ("qwen", False, len(body))


def test_other_methods_are_routed_without_reading_the_body() -> None:
    r = parser("sglanggrpc-parser").parse("/sglang.runtime.v1.SglangService/Generate", b"\x01junk", {})
    assert (r.prompt_text, r.model_rewritable, r.body_size) == ("", False, 5)


@pytest.mark.parametrize("body,message", [
    (bytes([0, 0, 0]), "parsing gRPC payload for TextGenerate: invalid gRPC frame"),
    (bytes([1, 0, 0, 0, 0]), "parsing gRPC payload for TextGenerate: compressed gRPC payload is not supported"),
    (frame(b"\xff"), "parsing gRPC payload for TextGenerate: not a valid protobuf TextGenerateRequest"),
], ids=["too-short", "compressed", "bad-proto"])
def test_bad_bodies_are_400(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as info:
        parser("sglanggrpc-parser").parse(TEXT_GENERATE_PATH, body, {})
    assert info.value.status == 400 and info.value.message.startswith(message)


def response(**meta: str) -> bytes:
    return frame(pb.TextGenerateResponse(text="generated text", meta_info=meta))


@pytest.mark.parametrize("chunks,usage", [
    ([response(prompt_tokens="10", completion_tokens="20")], (10, 20, None)),
    ([response()], NO_USAGE),
    ([response(other_key="value")], NO_USAGE),
    ([response(prompt_tokens="abc", completion_tokens="def")], NO_USAGE),
    ([response(prompt_tokens="7")], (7, 0, None)),
    ([response(prompt_tokens=" 12tokens", completion_tokens="3")], (12, 3, None)),
    ([response(prompt_tokens="5", completion_tokens="1"), response(), response(prompt_tokens="5",
                                                                               completion_tokens="9")], (5, 9, None)),
    ([frame(b"\xff")], NO_USAGE),
], ids=["meta-info", "no-meta-info", "no-token-keys", "non-integer", "prompt-only", "leading-integer-as-sscanf",
        "last-wins", "malformed"])
def test_usage_is_read_from_meta_info(chunks: list[bytes], usage: tuple) -> None:
    reader = parser("sglanggrpc-parser").usage_reader(None, False)
    stream = b"".join(chunks)
    for i in range(0, len(stream), 3):
        reader.feed(stream[i:i + 3])
    assert reader.usage() == usage
