"""Parsers: openai-parser delegates to parse_request; passthrough-parser accepts any bytes."""

from __future__ import annotations

import orjson
import pytest

from epp.errors import BadRequest, InvalidJson, InvalidShape, MissingModel
from epp.framework.request import ApiKind
from epp.plugins.parsers.openai import OpenAIParser
from epp.plugins.parsers.passthrough import PassthroughParser

from .helpers import make

CHAT = orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7})


def test_openai_parser_parses_chat() -> None:
    r = make(OpenAIParser).parse("/v1/chat/completions", CHAT, {"x-gateway-inference-fairness-id": "tenant-a"})
    assert (r.model, r.api, r.max_tokens, r.fairness_id) == ("llama", ApiKind.CHAT_COMPLETIONS, 7, "tenant-a")
    assert r.prompt_text == '[{"role":"user","content":"hi"}]'


@pytest.mark.parametrize("path,body,error", [
    ("/v1/completions", b"{", InvalidJson),
    ("/v1/completions", b'{"prompt":"x"}', MissingModel),
    ("/v1/chat/completions", b'{"model":"m"}', InvalidShape),
], ids=["not-json", "no-model", "chat-without-messages"])
def test_openai_parser_errors_are_bad_requests(path: str, body: bytes, error: type[BadRequest]) -> None:
    with pytest.raises(error) as info:
        make(OpenAIParser).parse(path, body, {})
    assert info.value.status == 400


@pytest.mark.parametrize("path,body,headers,expected", [
    ("/v1/completions", b"\x00\xffnot json at all", {},
     dict(model="", api=ApiKind.COMPLETIONS, prompt_text="\x00\ufffdnot json at all", input_tokens=4)),
    ("/v1/chat/completions", b'{"model":"ignored"}', {"x-gateway-model-name-rewrite": "target"},
     dict(model="target", target_model="target", api=ApiKind.CHAT_COMPLETIONS, prompt_text='{"model":"ignored"}')),
    ("/anything", b"", {"x-request-id": "rid-1", "x-gateway-inference-objective": "gold",
                        "x-session-token": "c2Vzcw=="},
     dict(request_id="rid-1", objective="gold", session_token="c2Vzcw==", input_tokens=1, body_size=0,
          fairness_id="default-flow", max_tokens=None, body={})),
], ids=["binary-body", "model-from-header", "headers"])
def test_passthrough_parser(path: str, body: bytes, headers: dict, expected: dict) -> None:
    r = make(PassthroughParser).parse(path, body, headers)
    assert {k: getattr(r, k) for k in expected} == expected
