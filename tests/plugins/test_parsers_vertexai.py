"""vertexai-parser: the reference's vertexai_test.go cases (requests and responses), plus EPP's errors and
usage reading across chunk boundaries."""

from __future__ import annotations

import pytest

from epp._pb.engines import vertexai_pb2 as pb
from epp.errors import BadRequest, InvalidJson, InvalidShape
from epp.framework.request import ApiKind
from epp.usage import NO_USAGE

from .parsers import frame, parser

PREFIX = "/google.cloud.aiplatform.v1beta1.PredictionService/"
GRPC = {"content-type": "application/grpc"}
CHAT_JSON = b'{"messages":[{"role":"user","content":"Hello"}],"stream":true}'


def wrapped(message: type, data: bytes) -> bytes:
    return frame(message(http_body=pb.HttpBody(data=data)))


@pytest.mark.parametrize("method,message,data,expected", [
    ("ChatCompletions", pb.ChatCompletionsRequest, CHAT_JSON,
     dict(api=ApiKind.CHAT_COMPLETIONS, stream=True, prompt_text='[{"role":"user","content":"Hello"}]')),
    ("StreamRawPredict", pb.StreamRawPredictRequest, b'{"input":"Hello from stream raw predict"}',
     dict(api=ApiKind.RESPONSES, stream=False, prompt_text='[null,null,"Hello from stream raw predict"]')),
    ("RawPredict", pb.RawPredictRequest, b'{"input":"Hello from raw predict"}',
     dict(api=ApiKind.RESPONSES, stream=False, prompt_text='[null,null,"Hello from raw predict"]')),
], ids=["chat-completions", "stream-raw-predict", "raw-predict"])
def test_the_openai_body_inside_the_message_is_parsed(method: str, message: type, data: bytes,
                                                       expected: dict) -> None:
    body = wrapped(message, data)
    r = parser("vertexai-parser").parse(PREFIX + method, body, GRPC)
    assert {k: getattr(r, k) for k in expected} == expected
    assert (r.model, r.target_model, r.body_size, r.model_rewritable) == ("", "", len(body), False)


def test_the_model_is_read_when_the_json_names_one_and_the_header_picks_the_target() -> None:
    body = wrapped(pb.ChatCompletionsRequest, b'{"model":"gemma","max_tokens":12,"cache_salt":"s",'
                                              b'"messages":[{"role":"user","content":"hi"}]}')
    r = parser("vertexai-parser").parse(PREFIX + "ChatCompletions", body,
                                        {**GRPC, "x-llm-d-router-model-name-rewrite": "gemma-2b", "x-request-id": "r1"})
    assert (r.model, r.target_model, r.max_tokens, r.cache_salt, r.request_id) == ("gemma", "gemma-2b", 12, "s", "r1")


def test_an_unsupported_method_is_routed_without_reading_the_body() -> None:
    r = parser("vertexai-parser").parse("/unsupported/path", b"", GRPC)
    assert (r.prompt_text, r.api, r.model, r.model_rewritable, r.body_size) == ("", ApiKind.COMPLETIONS, "", False, 0)


@pytest.mark.parametrize("method,body,error,message", [
    ("ChatCompletions", b"\x00\x00\x00\x00", BadRequest, "invalid gRPC frame"),
    ("ChatCompletions", b"\x00\x00\x00\x00\x01\xff", BadRequest, "unmarshaling ChatCompletionsRequest"),
    ("StreamRawPredict", b"\x00\x00\x00\x00\x01\xff", BadRequest, "unmarshaling StreamRawPredictRequest"),
    ("RawPredict", b"\x00\x00\x00\x00\x01\xff", BadRequest, "unmarshaling RawPredictRequest"),
    ("ChatCompletions", frame(pb.ChatCompletionsRequest(endpoint="e")), BadRequest,
     "ChatCompletionsRequest has no HttpBody"),
    ("ChatCompletions", frame(pb.ChatCompletionsRequest(), compressed=True), BadRequest,
     "compressed gRPC payload is not supported"),
    ("ChatCompletions", b"\x00\x00\x00\x00\x09abc", BadRequest, "incomplete gRPC payload"),
    ("ChatCompletions", wrapped(pb.ChatCompletionsRequest, b"{not json"), InvalidJson,
     "parsing ChatCompletionsRequest: request body is not valid JSON"),
    ("ChatCompletions", wrapped(pb.ChatCompletionsRequest, b'{"model":"m"}'), InvalidShape,
     "parsing ChatCompletionsRequest: chat completions request needs a non-empty 'messages' array"),
    ("RawPredict", wrapped(pb.RawPredictRequest, b'{"prompt":"x"}'), InvalidShape,
     "parsing RawPredictRequest: responses request needs 'input'"),
], ids=["short-frame", "bad-proto-chat", "bad-proto-stream-raw", "bad-proto-raw", "no-http-body", "compressed",
        "incomplete", "inner-not-json", "chat-without-messages", "raw-predict-without-input"])
def test_bad_bodies_are_400_with_the_reason(method: str, body: bytes, error: type, message: str) -> None:
    with pytest.raises(error) as info:
        parser("vertexai-parser").parse(PREFIX + method, body, GRPC)
    assert info.value.status == 400 and message in info.value.message


def http_body(data: bytes) -> bytes:
    return frame(pb.HttpBody(data=data))


USAGE_JSON = b'{"object":"chat.completion","usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}'


@pytest.mark.parametrize("chunks,usage", [
    ([b""], NO_USAGE),
    ([http_body(USAGE_JSON)], (10, 20, None)),
    ([b"\x00\x00\x00\x00"], NO_USAGE),
    ([frame(b"\xff")], NO_USAGE),
    ([http_body(USAGE_JSON)[:7], http_body(USAGE_JSON)[7:]], (10, 20, None)),
    ([http_body(b'{"choices":[]}'), http_body(b'{"usage":{"prompt_tokens":3,"completion_tokens":1,'
                                              b'"prompt_tokens_details":{"cached_tokens":2}}}')], (3, 1, 2)),
    ([http_body(b'data: {"choices":[{"delta":{}}],"usage":null}\n\n'),
      http_body(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4}}\n\ndata: [DONE]\n\n')],
     (5, 4, None)),
], ids=["empty", "json", "short-frame", "bad-proto", "split-frame", "last-usage-wins", "sse-in-http-body"])
def test_usage_is_read_from_the_http_body_responses(chunks: list[bytes], usage: tuple) -> None:
    reader = parser("vertexai-parser").usage_reader(None, False)
    for chunk in chunks:
        reader.feed(chunk)
    assert reader.usage() == usage
