"""anthropic-parser: the reference's anthropic_test.go request cases, and its count_tokens and render paths."""

from __future__ import annotations

import orjson
import pytest

from epp.errors import BadRequest, InvalidShape, MissingModel
from epp.framework.request import ApiKind

from .parsers import parser

MODEL = "claude-sonnet-4-6"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.mark.parametrize("headers,extra,expected", [
    ({":path": "/v1/messages"}, {"messages": [{"role": "user", "content": "Hello, Claude"}]},
     dict(prompt_text="userHello, Claude", stream=False, cache_salt=None)),
    ({":path": "/v1/messages"},
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe this image"}]}]},
     dict(prompt_text="userDescribe this image")),
    ({":path": "/v1/messages"}, {"system": "You are a helpful assistant.", "messages": HELLO},
     dict(prompt_text="You are a helpful assistant.userHello")),
    ({":path": "/v1/messages"}, {"system": [{"type": "text", "text": "You are a helpful assistant."}],
                                 "messages": HELLO}, dict(prompt_text="You are a helpful assistant.userHello")),
    ({":path": "/v1/messages"}, {"tools": [{"name": "get_weather", "description": "Get the weather"}],
                                 "messages": [{"role": "user", "content": "What's the weather?"}]},
     dict(prompt_text='[{"description":"Get the weather","name":"get_weather"}]userWhat\'s the weather?')),
    ({":path": "/v1/messages"}, {"stream": True, "messages": HELLO}, dict(stream=True)),
    ({":path": "/v1/messages"}, {"cache_salt": "test-salt-123", "messages": HELLO}, dict(cache_salt="test-salt-123")),
    ({"x-original-path": "/v1/messages"}, {"messages": HELLO}, dict(prompt_text="userHello")),
], ids=["text", "content-blocks", "system-string", "system-blocks", "tools", "stream", "cache-salt",
        "x-original-path"])
def test_messages_requests_are_parsed_as_the_messages_api(headers: dict, extra: dict, expected: dict) -> None:
    body = orjson.dumps({"model": MODEL, "max_tokens": 1024, **extra})
    r = parser("anthropic-parser").parse(headers.get(":path", ""), body, headers)
    assert {k: getattr(r, k) for k in expected} == expected
    assert (r.api, r.model, r.max_tokens, r.model_rewritable) == (ApiKind.MESSAGES, MODEL, 1024, True)


@pytest.mark.parametrize("path,body,error,message", [
    ("/v1/messages", {"model": MODEL, "max_tokens": 1024, "messages": []}, InvalidShape, "non-empty 'messages'"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 1024}, InvalidShape, "non-empty 'messages'"),
    ("/v1/messages", None, BadRequest, "JSON object"),
    ("/v1/chat/completions", {"model": MODEL, "messages": HELLO}, InvalidShape,
     "unsupported API endpoint: /v1/chat/completions"),
    ("", {"model": MODEL, "messages": HELLO}, InvalidShape, "unsupported API endpoint"),
    ("/v1/messages/count_tokens", {"messages": HELLO}, MissingModel, "invalid count_tokens request: must have a model"),
    ("/v1/messages/count_tokens", {"model": "", "messages": HELLO}, MissingModel, "must have a model"),
    ("/v1/messages/count_tokens", [1], BadRequest, "error unmarshaling request body"),
], ids=["empty-messages", "missing-messages", "null-body", "unsupported-path", "no-path", "count-tokens-no-model",
        "count-tokens-empty-model", "count-tokens-not-an-object"])
def test_bad_requests_are_400(path: str, body: object, error: type, message: str) -> None:
    with pytest.raises(error) as info:
        parser("anthropic-parser").parse(path, orjson.dumps(body), {":path": path} if path else {})
    assert info.value.status == 400 and message in info.value.message


@pytest.mark.parametrize("path,body,expected", [
    ("/v1/messages/count_tokens", {"model": MODEL, "max_tokens": 64, "messages": HELLO},
     dict(model=MODEL, max_tokens=64, prompt_text="")),
    ("/v1/messages/count_tokens/", {"model": MODEL, "messages": HELLO}, dict(model=MODEL, max_tokens=None)),
    ("/v1/messages/render", {"model": MODEL, "messages": HELLO}, dict(model=MODEL, prompt_text="")),
    ("/v1/messages/render?x=1", {"messages": HELLO}, dict(model="", prompt_text="")),
], ids=["count-tokens", "count-tokens-trailing-slash", "render", "render-without-model"])
def test_count_tokens_and_render_read_the_envelope_only(path: str, body: dict, expected: dict) -> None:
    raw = orjson.dumps(body)
    r = parser("anthropic-parser").parse(path, raw, {"x-llm-d-router-model-name-rewrite": "served"})
    assert {k: getattr(r, k) for k in expected} == expected
    assert (r.api, r.body, r.body_size, r.target_model, r.model_rewritable) == (
        ApiKind.MESSAGES, body, len(raw), "served", True)
