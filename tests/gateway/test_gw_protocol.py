"""Pure functions of the gateway: usage reading, SSE rewriting, P/D body shaping, header filtering."""

from __future__ import annotations

import asyncio

import orjson
import pytest

import epp.gateway
from epp.framework.endpoint import Endpoint, EndpointSpec
from epp.framework.request import ApiKind
from epp.gateway import loop_factory
from epp.gateway._pd import PREFILL_KV_PARAMS, decode_body, parse_prefill_response, prefill_body
from epp.gateway._upstream import client_headers, upstream_headers, upstream_url
from epp.usage import (
    MessagesUsageReader,
    ResponseRestorer,
    UsageReader,
    messages_usage_from_body,
    restore_body,
    usage_from_body,
)

CHAT_USAGE = b'{"usage":{"prompt_tokens":7,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}'
RESP_DONE = (b'{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":9,"output_tokens":2,'
             b'"input_tokens_details":{"cached_tokens":1}}}}')
STREAM = (b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n'
          b'data: {"choices":[{"delta":{"content":"b"}}],"usage":null}\n\n'
          b'data: {"choices":[],"usage": {"prompt_tokens":5,"completion_tokens":2,'
          b'"prompt_tokens_details":{"cached_tokens":3}}}\n\n'
          b"data: [DONE]\n\n")


@pytest.mark.parametrize(("body", "usage"), [
    (CHAT_USAGE, (7, 3, 4)),
    (b'{"usage":{"prompt_tokens":7,"total_tokens":7}}', (7, None, None)),
    (b'{"usage":{"input_tokens":9,"output_tokens":2,"input_tokens_details":{"cached_tokens":1}}}', (9, 2, 1)),
    (b'{"usage":null}', (None, None, None)),
    (b"not json with \"usage\"", (None, None, None)),
    (b'{"choices":[]}', (None, None, None)),
], ids=["chat", "embeddings", "responses", "null", "not-json", "absent"])
def test_usage_from_json_body(body, usage):
    assert usage_from_body(body) == usage


@pytest.mark.parametrize("size", [1, 3, 7, 64, len(STREAM)], ids=lambda n: f"chunks-of-{n}")
def test_sse_usage_is_the_last_usage_object_across_chunk_splits(size):
    tracker = UsageReader()
    for i in range(0, len(STREAM), size):
        tracker.feed(STREAM[i:i + size])
    assert tracker.usage() == (5, 2, 3)


@pytest.mark.parametrize("size", [1, 3, 7, 64, len(STREAM)], ids=lambda n: f"chunks-of-{n}")
def test_sse_usage_fed_as_framed_chunks_matches_feeding_the_payloads(size):
    """The relay's per-token path hands over whole HTTP chunks as received; lines split across chunks, or a
    chunk of whole lines, give the same usage as feeding the decoded bytes."""
    tracker = UsageReader()
    for i in range(0, len(STREAM), size):
        part = STREAM[i:i + size]
        prefix = b"%x\r\n" % len(part)
        tracker.feed_chunk(prefix + part + b"\r\n", len(prefix))
    assert tracker.usage() == (5, 2, 3)


def test_sse_usage_of_a_responses_stream_and_of_a_last_line_without_newline():
    tracker = UsageReader()
    tracker.feed(b"event: response.created\ndata: {\"type\":\"response.created\"}\n\n")
    tracker.feed(b"event: response.completed\ndata: " + RESP_DONE)
    assert tracker.usage() == (9, 2, 1)


def test_sse_without_usage():
    tracker = UsageReader()
    tracker.feed(b'data: {"choices":[],"usage":null}\n\ndata: [DONE]\n\n')
    assert tracker.usage() == (None, None, None)


@pytest.mark.parametrize("size", [1, 5, len(STREAM)], ids=lambda n: f"chunks-of-{n}")
def test_sse_rewriter_sets_cached_tokens_and_model_without_losing_bytes(size):
    stream = STREAM.replace(b'"choices"', b'"model":"target","choices"')
    rewriter = ResponseRestorer(model="alias", cached=11)
    out = b"".join(rewriter.feed(stream[i:i + size]) for i in range(0, len(stream), size)) + rewriter.flush()
    events = [orjson.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b"data: {")]
    assert len(events) == 4 and all(e["model"] == "alias" for e in events)
    assert [e["usage"]["prompt_tokens_details"]["cached_tokens"] for e in events if e["usage"]] == [11, 11]
    assert out.endswith(b"data: [DONE]\n\n")


def test_json_rewrite_of_cached_tokens_and_model():
    body = restore_body(b'{"model":"t","usage":{"prompt_tokens":3,"prompt_tokens_details":null}}',
                        model="alias", cached=2)
    assert orjson.loads(body) == {"model": "alias",
                                  "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}}
    assert restore_body(b"plain text", model="a", cached=1) == b"plain text"


@pytest.mark.parametrize(("api", "limits"), [
    (ApiKind.CHAT_COMPLETIONS, {"max_tokens": 1, "max_completion_tokens": 1}),
    (ApiKind.COMPLETIONS, {"max_tokens": 1, "max_completion_tokens": 1}),
    (ApiKind.RESPONSES, {"max_output_tokens": 1}),
], ids=["chat", "completions", "responses"])
def test_prefill_body(api, limits):
    original = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "min_tokens": 4,
                "max_tokens": 50, "messages": []}
    frozen = orjson.dumps(original)
    body = orjson.loads(prefill_body(original, api, "target"))
    assert body["kv_transfer_params"] == PREFILL_KV_PARAMS and body["stream"] is False
    assert body["model"] == "target"
    assert "stream_options" not in body and "min_tokens" not in body
    assert {k: body[k] for k in limits} == limits
    assert orjson.dumps(original) == frozen  # the parsed request is shared with plugins: never mutated


def test_decode_body_and_prefill_answer():
    answer = b'{"kv_transfer_params":{"remote_block_ids":[1,2]},"usage":{"prompt_tokens_details":null}}'
    outcome = parse_prefill_response(answer)
    assert outcome is not None and outcome.cached_tokens == 0
    body = orjson.loads(decode_body({"model": "m", "max_tokens": 9}, outcome.kv_transfer_params))
    assert body == {"model": "m", "max_tokens": 9, "kv_transfer_params": {"remote_block_ids": [1, 2]}}
    assert parse_prefill_response(b"<html>") is None


# An Anthropic Messages stream: the prompt counts come with message_start (inside "message"), the completion with
# message_delta (Anthropic's own API may leave input_tokens out of message_delta; vLLM repeats it there).
MESSAGES_STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"m1","model":"target","content":[],'
    b'"usage":{"input_tokens":25,"cache_read_input_tokens":80,"output_tokens":1}}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"the \\"usage\\" is"}}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":15}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n')


@pytest.mark.parametrize(("body", "usage"), [
    (b'{"type":"message","usage":{"input_tokens":9,"output_tokens":4}}', (9, 4, None)),
    (b'{"usage":{"input_tokens":100,"output_tokens":50,"cache_read_input_tokens":80,'
     b'"cache_creation_input_tokens":20}}', (200, 50, 80)),
    (b'{"type":"message"}', (None, None, None)),
    (b"not json", (None, None, None)),
], ids=["vllm", "anthropic-cache-counts-add-up", "absent", "not-json"])
def test_messages_usage_from_json_body(body, usage):
    assert messages_usage_from_body(body) == usage


@pytest.mark.parametrize("size", [1, 7, 64, len(MESSAGES_STREAM)], ids=lambda n: f"chunks-of-{n}")
def test_messages_stream_usage_takes_the_prompt_from_message_start_and_output_from_message_delta(size):
    tracker = MessagesUsageReader()
    for i in range(0, len(MESSAGES_STREAM), size):
        tracker.feed(MESSAGES_STREAM[i:i + size])
    assert tracker.usage() == (105, 15, 80)
    plain = UsageReader()  # what the OpenAI reading makes of it: the last usage only, no prompt
    plain.feed(MESSAGES_STREAM)
    assert plain.usage() == (None, 15, None)


def test_messages_stream_cut_after_message_start_still_has_its_prompt():
    tracker = MessagesUsageReader()
    tracker.feed(MESSAGES_STREAM[:MESSAGES_STREAM.index(b"event: content_block_delta")])
    assert tracker.usage() == (105, 1, 80)


def test_sse_rewriter_restores_the_model_inside_message_start():
    rewriter = ResponseRestorer(model="alias", cached=None, inner_key="message")
    out = rewriter.feed(MESSAGES_STREAM) + rewriter.flush()
    start = orjson.loads(out.split(b"\n")[1][6:])
    assert start["message"]["model"] == "alias"
    assert out.replace(b'"alias"', b'"target"') == MESSAGES_STREAM  # nothing else changed


def test_upstream_headers_drop_hop_by_hop_and_epp_headers():
    client = {"host": "gw", "content-length": "10", "connection": "keep-alive, x-private", "x-private": "1",
              "keep-alive": "5", "te": "trailers", "accept-encoding": "gzip", "authorization": "Bearer k",
              "x-gateway-inference-fairness-id": "tenant", "x-prefiller-host-port": "1.2.3.4:5",
              "content-type": "application/x-www-form-urlencoded", "x-request-id": "old"}
    out = upstream_headers(client, {"x-extra": "v"}, "rid", drop_prefiller=True)
    assert out == {"authorization": "Bearer k", "content-type": "application/json", "x-extra": "v",
                   "x-request-id": "rid"}
    kept = upstream_headers(client, {"x-prefiller-host-port": "9.9.9.9:1"}, "rid", drop_prefiller=False)
    assert kept["x-prefiller-host-port"] == "9.9.9.9:1"


def test_client_headers_and_url():
    out = client_headers({"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked", "Date": "x",
                          "Server": "uvicorn", "X-Custom": "1"}, {"x-routed-to": "a"})
    assert dict(out) == {"Content-Type": "text/event-stream", "X-Custom": "1", "x-routed-to": "a"}
    ep = Endpoint(EndpointSpec("e", "::1", 8000))
    assert str(upstream_url(ep, "/v1/completions?x=%20")) == "http://[::1]:8000/v1/completions?x=%20"


def test_loop_factory_prefers_uvloop_when_installed():
    uvloop = pytest.importorskip("uvloop")
    loop = loop_factory()()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    assert loop_factory(prefer_uvloop=False) is asyncio.new_event_loop


def test_exported_members():
    assert set(epp.gateway.__all__) == {
        "make_gateway_app", "GatewayServer", "UpstreamLimits", "loop_factory", "run", "uvloop_available",
        "DEFAULT_BODY_LIMIT", "INFERENCE_PATHS", "CLIENT_GONE", "Proxy", "ProxySettings", "ModelCatalog",
        "DIRECTOR_KEY", "PROXY_KEY", "SESSION_KEY", "CATALOG_KEY", "set_draining"}
    assert all(hasattr(epp.gateway, name) for name in epp.gateway.__all__)
