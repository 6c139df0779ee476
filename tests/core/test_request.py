"""parse_request: typed errors for bad bodies and the fields the scheduler relies on."""

from __future__ import annotations

import uuid

import orjson
import pytest

from epp.errors import BadRequest, BodyNotObject, InvalidJson, InvalidShape, MissingModel, openai_error_body
from epp.framework.request import ApiKind, api_kind_for_path, is_messages_path, new_request_id, parse_request


def _body(**kw: object) -> bytes:
    return orjson.dumps(kw)


@pytest.mark.parametrize("path,body,error", [
    ("/v1/chat/completions", b"{not json", InvalidJson),
    ("/v1/chat/completions", b"[1,2]", BodyNotObject),
    ("/v1/chat/completions", b'"text"', BodyNotObject),
    ("/v1/chat/completions", _body(messages=[{"role": "user", "content": "hi"}]), MissingModel),
    ("/v1/chat/completions", _body(model=7, messages=[{"role": "user", "content": "hi"}]), MissingModel),
    ("/v1/chat/completions", _body(model="", messages=[{"role": "user", "content": "hi"}]), MissingModel),
    ("/v1/chat/completions", _body(model="m"), InvalidShape),
    ("/v1/chat/completions", _body(model="m", messages=[]), InvalidShape),
    ("/v1/completions", _body(model="m"), InvalidShape),
    ("/v1/completions", _body(model="m", prompt=5), InvalidShape),
    ("/v1/responses", _body(model="m"), InvalidShape),
    ("/v1/embeddings", _body(model="m"), InvalidShape),
    ("/v1/completions", _body(model="m", prompt="p", max_tokens=-1), InvalidShape),
    ("/v1/completions", _body(model="m", prompt="p", max_tokens="ten"), InvalidShape),
    ("/v1/completions", _body(model="m", prompt="p", max_tokens=5.5), InvalidShape),
    ("/v1/completions", _body(model="m", prompt="p", stream="maybe"), InvalidShape),
    ("/v1/completions", _body(model="m", prompt="p", stream=2), InvalidShape),
], ids=["not-json", "array", "string", "no-model", "model-int", "model-empty", "chat-no-messages",
        "chat-empty-messages", "completion-no-prompt", "completion-bad-prompt", "responses-no-input",
        "embeddings-no-input", "negative-max-tokens", "string-max-tokens", "fractional-max-tokens",
        "stream-word", "stream-two"])
def test_bad_bodies_raise_distinct_bad_request(path: str, body: bytes, error: type[BadRequest]) -> None:
    with pytest.raises(error) as info:
        parse_request(path, body, {})
    assert info.value.status == 400
    assert type(info.value) is error


def test_error_body_is_openai_shaped() -> None:
    with pytest.raises(MissingModel) as info:
        parse_request("/v1/completions", _body(prompt="x"), {})
    payload = orjson.loads(openai_error_body(info.value))
    assert payload["error"]["param"] == "model"
    assert payload["error"]["type"] == "invalid_request_error"
    assert "model" in payload["error"]["message"]


def test_chat_request_fields_from_body_and_headers() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    body = _body(model="llama", messages=messages, max_completion_tokens=64, stream=True)
    headers = {"x-gateway-inference-fairness-id": "tenant-a", "x-gateway-inference-objective": "critical",
               "x-session-token": "c2Vzcw==", "x-request-id": "rid-1", "x-gateway-model-name-rewrite": "llama-v2"}
    req = parse_request("/v1/chat/completions", body, headers)
    assert req.api is ApiKind.CHAT_COMPLETIONS
    assert req.prompt_text == orjson.dumps(messages).decode()
    assert req.input_tokens == len(req.prompt_text) // 4
    assert (req.max_tokens, req.stream, req.request_id) == (64, True, "rid-1")
    assert (req.fairness_id, req.objective, req.session_token) == ("tenant-a", "critical", "c2Vzcw==")
    assert (req.model, req.target_model) == ("llama", "llama-v2")
    assert req.estimated_total_tokens == req.input_tokens + 64


@pytest.mark.parametrize("prompt, max_tokens", [("x" * 400, 4096), ("x" * 400, None), ("x" * 405, 1)],
                         ids=["max-tokens", "no-max-tokens", "odd-input"])
def test_total_token_estimate_is_the_prompt_plus_max_tokens(prompt: str, max_tokens: int | None) -> None:
    """The most a request can occupy: the prompt estimate plus ``max_tokens`` (1.5x the prompt when unset). The
    in-flight estimate is the inflight-load-producer's (tests/plugins/test_inflight_load_producer.py)."""
    body = _body(model="m", prompt=prompt, **({} if max_tokens is None else {"max_tokens": max_tokens}))
    req = parse_request("/v1/completions", body, {})
    assert req.body_size == len(body)
    assert req.estimated_total_tokens == req.input_tokens + (max_tokens if max_tokens is not None
                                                             else req.input_tokens * 3 // 2)


def test_defaults_when_headers_absent() -> None:
    req = parse_request("/v1/completions", _body(model="m", prompt="abc"), {})
    assert req.fairness_id == "default-flow"
    assert req.objective is None and req.priority == 0 and not req.sheddable
    assert req.input_tokens == 1  # at least one token
    assert req.max_tokens is None
    assert req.estimated_total_tokens == 1 + 1  # 1.5x the prompt estimate, floored
    assert len(req.request_id) == 36  # a generated UUID


@pytest.mark.parametrize("body,expected", [
    (_body(model="m", input="hello", instructions="sys", tools=[{"type": "x"}]),
     orjson.dumps(["sys", [{"type": "x"}], "hello"]).decode()),
    (_body(model="m", input=[{"role": "user", "content": "hi"}]),
     orjson.dumps([None, None, [{"role": "user", "content": "hi"}]]).decode()),
], ids=["with-instructions-and-tools", "input-items"])
def test_responses_prefix_text_is_instructions_tools_input(body: bytes, expected: str) -> None:
    req = parse_request("/v1/responses", body, {})
    assert req.api is ApiKind.RESPONSES and req.prompt_text == expected


def test_completion_prompt_list_and_max_output_tokens() -> None:
    req = parse_request("/v1/completions", _body(model="m", prompt=["one"], max_tokens=3), {})
    assert req.prompt_text == "one" and req.max_tokens == 3
    req = parse_request("/v1/responses", _body(model="m", input="x", max_output_tokens=9), {})
    assert req.max_tokens == 9


@pytest.mark.parametrize("path,kind", [
    ("/v1/chat/completions", ApiKind.CHAT_COMPLETIONS), ("/v1/completions?x=1", ApiKind.COMPLETIONS),
    ("/v1/responses", ApiKind.RESPONSES), ("/v1/embeddings/", ApiKind.EMBEDDINGS), ("/v1/models", None),
])
def test_api_kind_for_path(path: str, kind: ApiKind | None) -> None:
    assert api_kind_for_path(path) is kind


def test_unknown_path_guesses_from_body() -> None:
    assert parse_request("/generate", _body(model="m", prompt="p"), {}).api is ApiKind.COMPLETIONS
    assert parse_request("/x", _body(model="m", messages=[{"role": "user", "content": "c"}]), {}).api \
        is ApiKind.CHAT_COMPLETIONS


def test_generated_request_ids_are_distinct_version_4_uuids() -> None:
    ids = [new_request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for rid in ids:
        parsed = uuid.UUID(rid)
        assert str(parsed) == rid and parsed.version == 4 and parsed.variant == uuid.RFC_4122


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("stream", "false", False), ("stream", "True", True), ("stream", 0, False), ("stream", 1, True),
    ("stream", "off", False), ("max_tokens", 5.0, 5), ("max_tokens", "10", 10),
])
def test_fields_are_read_as_vllms_lax_request_models_read_them(field: str, value: object, expected: object) -> None:
    """``"stream": "false"`` is False (``bool("false")`` is True) and ``max_tokens`` 5.0 or "10" are integers, as
    vLLM's pydantic request models accept them, so EPP and the server agree on what a request asks for."""
    req = parse_request("/v1/completions", _body(model="m", prompt="p", **{field: value}), {})
    assert (req.stream if field == "stream" else req.max_tokens) == expected


def test_a_header_value_that_is_not_utf8_is_a_400_not_a_metric_label() -> None:
    """Front ends decode header bytes with surrogateescape; such a value (here a lone 0xff byte) in a header EPP
    uses as a label or a model name is refused instead of breaking /metrics or the JSON body."""
    bad = b"tenant-\xff".decode("utf-8", "surrogateescape")
    for name in ("x-gateway-inference-fairness-id", "x-gateway-model-name-rewrite", "x-gateway-inference-objective"):
        with pytest.raises(InvalidShape, match=name):
            parse_request("/v1/completions", _body(model="m", prompt="p"), {name: bad})
    ok = parse_request("/v1/completions", _body(model="m", prompt="p"),
                       {"x-gateway-inference-fairness-id": "tenant-é"})
    assert ok.fairness_id == "tenant-é"


def test_input_tokens_count_utf8_bytes_as_the_reference_does() -> None:
    """Thirty CJK characters are 90 UTF-8 bytes: 22 tokens at bytes/4 (Go's len), not 7 from characters."""
    req = parse_request("/v1/completions", _body(model="m", prompt="字" * 30), {})
    assert req.input_tokens == 22


@pytest.mark.parametrize("content, expected", [
    (rb"truncated emoji \ud83d", "truncated emoji \ufffd"),
    (rb"\udc00 lone low", "\ufffd lone low"),
    (rb"\ud83d\ud83d\ude00", "\ufffd\U0001f600"),
    (rb"\\ud83d \ud83d", "\\ud83d \ufffd"),
], ids=["lone-high-at-end", "lone-low", "high-before-a-pair", "escaped-backslash-is-text"])
def test_a_lone_surrogate_escape_becomes_u_fffd_as_go_reads_it(content: bytes, expected: str) -> None:
    # orjson refuses lone surrogates; the reference (Go encoding/json) and vLLM (Python json) accept the request.
    body = b'{"model":"m","messages":[{"role":"user","content":"' + content + b'"}]}'
    req = parse_request("/v1/chat/completions", body, {})
    assert req.body["messages"][0]["content"] == expected
    assert orjson.loads(req.prompt_text)[0]["content"] == expected  # the prefix text serializes
    assert orjson.loads(orjson.dumps({**req.body, "model": "t"}))["model"] == "t"  # so does a model rewrite


def test_a_body_invalid_for_another_reason_still_names_orjsons_error() -> None:
    with pytest.raises(InvalidJson, match="request body is not valid JSON: .*surrogate"):
        parse_request("/v1/chat/completions", rb'{"model":"m","messages":[{"content":"\ud83d"}]', {})
    with pytest.raises(InvalidJson):
        parse_request("/v1/chat/completions", b'{"model":"m","prompt":"\xff"}', {})  # raw invalid UTF-8


# -- the Anthropic Messages API (/v1/messages) -----------------------------------------------------------------

def test_messages_request_is_flattened_as_the_reference_does() -> None:
    """System text, the tools' JSON, then each message's role and text (the reference's ``messagesBytes``):
    only text blocks count, an image by a digest of its source, tool results not at all."""
    body = _body(model="claude", max_tokens=64, max_completion_tokens=5, stream=True,
                 system=[{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "Be kind."}],
                 tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
                 messages=[{"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": [{"type": "text", "text": "Hello"},
                                                             {"type": "tool_use", "id": "t1", "name": "x"}]},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                         "content": "sunny"},
                                                        {"type": "image", "source": {"type": "url", "url": "u"}}]}])
    req = parse_request("/v1/messages", body, {"x-gateway-model-name-rewrite": "served"})
    assert req.api is ApiKind.MESSAGES
    tools = '[{"input_schema":{"type":"object"},"name":"get_weather"}]'
    image = req.prompt_text.removeprefix("Be brief. Be kind." + tools + "userHiassistantHellouser")
    assert image.startswith("<image:") and image.endswith(">") and len(image) == len("<image:>") + 16
    assert req.max_tokens == 64  # the Messages API's only limit; max_completion_tokens is not its field
    assert (req.stream, req.model, req.target_model) == (True, "claude", "served")
    assert req.input_tokens == len(req.prompt_text) // 4


def test_messages_with_a_string_system_and_another_image_hash_differently() -> None:
    def text(url: str) -> str:
        return parse_request("/v1/messages", _body(model="m", max_tokens=1, system="sys", messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": url}}]}]), {}).prompt_text
    assert text("a").startswith("sysuser<image:") and text("a") != text("b") and text("a") == text("a")


@pytest.mark.parametrize("body", [
    _body(model="m", max_tokens=1),
    _body(model="m", max_tokens=1, messages=[]),
    _body(model="m", max_tokens=1, messages=["hi"]),
    _body(model="m", max_tokens=1, messages=[{"role": "user", "content": 5}]),
    _body(model="m", max_tokens=1, messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
    _body(model="m", max_tokens=1, messages=[{"role": 1, "content": "x"}]),
    _body(model="m", max_tokens=1, system=7, messages=[{"role": "user", "content": "x"}]),
    _body(model="m", max_tokens=1, tools={"name": "t"}, messages=[{"role": "user", "content": "x"}]),
    _body(model="m", max_tokens=-1, messages=[{"role": "user", "content": "x"}]),
], ids=["no-messages", "empty-messages", "message-not-object", "content-int", "text-not-string", "role-int",
        "system-int", "tools-object", "negative-max-tokens"])
def test_a_malformed_messages_request_is_a_400(body: bytes) -> None:
    with pytest.raises(InvalidShape):
        parse_request("/v1/messages", body, {})


@pytest.mark.parametrize("path, expected", [
    ("/v1/messages", True), ("/v1/messages?beta=true", True), ("/anthropic/v1/messages", True),
    ("/v1/chat/completions", False), ("/v1/messages/count_tokens", False), ("/", False),
])
def test_is_messages_path(path: str, expected: bool) -> None:
    assert is_messages_path(path) is expected
