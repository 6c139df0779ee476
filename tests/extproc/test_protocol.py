"""The ext_proc protocol, driven by a real grpc.aio client against a real ExtProcServer (no Envoy)."""

from __future__ import annotations

import asyncio

import grpc
import orjson
import pytest
from prometheus_client import CollectorRegistry

from epp.extproc.protocol import MAX_CHUNK, pb
from epp.headers import MODEL_REWRITE_HEADER, HeaderTrust
from epp.metrics.families import EppMetrics

from .helpers import (
    BUFFERED,
    CHAT,
    FULL_DUPLEX,
    STREAMED,
    Recorder,
    make_director,
    request_body,
    request_headers,
    response_body,
    response_headers,
    set_headers,
    specs,
)

LIST3 = """
plugins:
- type: queue-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 3}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"""


def body_chunks(replies: list[pb.ProcessingResponse]) -> list[pb.StreamedBodyResponse]:
    return [r.request_body.response.body_mutation.streamed_response for r in replies
            if r.WhichOneof("response") == "request_body"]


async def test_full_duplex_holds_headers_until_body_end_then_routes_and_streams_body_back(serve) -> None:
    director = make_director(specs(4), waiting={"ep0": 9, "ep1": 9, "ep2": 0, "ep3": 9})
    _, client = await serve(director)
    big = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 150_000}]})
    pieces = [big[:1000], big[1000:90_000], big[90_000:], b""]
    call = client.open()
    await call.write(request_headers())
    for i, piece in enumerate(pieces):
        await call.write(request_body(piece, eos=i == len(pieces) - 1))
    first = await call.read()
    assert first.WhichOneof("response") == "request_headers"
    common = first.request_headers.response
    headers = set_headers(common)
    assert headers["x-gateway-destination-endpoint"] == "10.0.0.3:8000"  # the only empty queue
    assert headers["content-length"] == str(len(big))  # computed from the whole body: the reply was held
    assert common.clear_route_cache
    lb = first.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value == "10.0.0.3:8000"
    assert lb["x-gateway-destination-endpoint-primary"].string_value == "10.0.0.3:8000"
    chunks = []
    while not chunks or not chunks[-1].end_of_stream:
        chunks.extend(body_chunks([await call.read()]))
    assert all(len(c.body) <= MAX_CHUNK for c in chunks) and len(chunks) == 3
    assert b"".join(c.body for c in chunks) == big  # unchanged body: the original bytes, not re-serialized
    assert [c.end_of_stream for c in chunks] == [False, False, True]
    await call.done_writing()
    call.cancel()


async def test_buffered_mode_continues_headers_and_routes_in_the_body_reply(serve) -> None:
    _, client = await serve(make_director(specs(2)))
    replies = await client.exchange([request_headers(mode=BUFFERED), request_body(CHAT)], 2)
    assert replies[0].WhichOneof("response") == "request_headers"
    assert not replies[0].request_headers.response.header_mutation.set_headers
    assert replies[1].WhichOneof("response") == "request_body"
    headers = set_headers(replies[1].request_body.response)
    assert headers["x-gateway-destination-endpoint"] in {"10.0.0.1:8000", "10.0.0.2:8000"}
    assert "content-length" not in headers  # body untouched
    assert not replies[1].request_body.response.HasField("body_mutation")
    assert "envoy.lb" in replies[1].dynamic_metadata.fields


async def test_configured_mode_overrides_protocol_config(serve) -> None:
    _, client = await serve(make_director(specs(1)), mode="buffered")
    replies = await client.exchange([request_headers(mode=FULL_DUPLEX), request_body(CHAT)], 2)
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]


async def test_without_protocol_config_full_duplex_is_assumed(serve) -> None:
    _, client = await serve(make_director(specs(1)))
    replies = await client.exchange([request_headers(mode=None), request_body(CHAT)], 2)
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]
    assert body_chunks(replies)[0].body == CHAT


async def test_request_without_body_goes_to_a_pool_endpoint(serve) -> None:
    _, client = await serve(make_director(specs(3)))
    replies = await client.exchange([request_headers("/v1/models", eos=True)], 1)
    headers = set_headers(replies[0].request_headers.response)
    assert headers["x-gateway-destination-endpoint"] in {f"10.0.0.{i}:8000" for i in (1, 2, 3)}


async def test_request_without_body_and_no_endpoints_is_500(serve) -> None:
    _, client = await serve(make_director([]))
    replies = await client.exchange([request_headers("/v1/models", eos=True)], 1)
    assert replies[0].immediate_response.status.code == 500


async def test_comma_separated_fallbacks_in_header_and_metadata_primary_alone(serve) -> None:
    director = make_director(specs(4), LIST3, waiting={"ep0": 3, "ep1": 0, "ep2": 1, "ep3": 2})
    _, client = await serve(director)
    replies = await client.exchange([request_headers(), request_body(CHAT)], 1)
    expected = "10.0.0.2:8000,10.0.0.3:8000,10.0.0.4:8000"
    assert set_headers(replies[0].request_headers.response)["x-gateway-destination-endpoint"] == expected
    lb = replies[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value == expected
    assert lb["x-gateway-destination-endpoint-primary"].string_value == "10.0.0.2:8000"


@pytest.mark.parametrize("subset, allowed", [
    (["10.0.0.2:9999"], {"10.0.0.2:8000"}),  # matched by IP only, as the reference
    (["10.0.0.3:8000", "10.0.0.4:8000"], {"10.0.0.3:8000", "10.0.0.4:8000"}),
], ids=["ip-only", "two"])
async def test_subset_hint_restricts_candidates(serve, subset: list[str], allowed: set[str]) -> None:
    _, client = await serve(make_director(specs(4)))
    for _ in range(6):
        replies = await client.exchange([request_headers(subset=subset), request_body(CHAT)], 1)
        assert set_headers(replies[0].request_headers.response)["x-gateway-destination-endpoint"] in allowed


async def test_empty_subset_hint_is_503(serve) -> None:
    _, client = await serve(make_director(specs(2)))
    replies = await client.exchange([request_headers(subset=[]), request_body(CHAT)], 1)
    assert replies[0].immediate_response.status.code == 503


@pytest.mark.parametrize("kind", ["string_value", "number_value", "bool_value"])
async def test_a_subset_hint_that_is_not_a_list_counts_as_absent(serve, kind: str) -> None:
    # The reference's `.([]any)` assertion fails for any other value, and then every endpoint is a candidate.
    _, client = await serve(make_director(specs(2)))
    headers = request_headers()
    hint = headers.metadata_context.filter_metadata["envoy.lb.subset_hint"].fields[
        "x-gateway-destination-endpoint-subset"]
    setattr(hint, kind, {"string_value": "10.0.0.9:8000", "number_value": 1.0, "bool_value": True}[kind])
    replies = await client.exchange([headers, request_body(CHAT)], 1)
    chosen = set_headers(replies[0].request_headers.response)["x-gateway-destination-endpoint"]
    assert chosen in {"10.0.0.1:8000", "10.0.0.2:8000"}


@pytest.mark.parametrize("subset", [[], ["10.0.0.9:8000"]], ids=["empty", "outside-the-pool"])
async def test_a_request_without_a_body_ignores_the_subset_hint(serve, subset: list[str]) -> None:
    # As the reference: a bodiless request (GET) goes to a random endpoint of the whole pool (GetRandomEndpoint).
    _, client = await serve(make_director(specs(2)))
    replies = await client.exchange([request_headers("/v1/models", eos=True, subset=subset)], 1)
    chosen = set_headers(replies[0].request_headers.response)["x-gateway-destination-endpoint"]
    assert chosen in {"10.0.0.1:8000", "10.0.0.2:8000"}


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "BadRequest"),
    (b'{"messages":[{"role":"user","content":"hi"}]}', 400, "BadRequest"),
    (b'{"model":"m"}', 400, "BadRequest"),
    (b"[1,2]", 400, "BadRequest"),
], ids=["bad-json", "no-model", "chat-without-messages", "not-object"])
async def test_bad_bodies_get_an_openai_error_immediate_response(serve, body: bytes, status: int, code: str) -> None:
    _, client = await serve(make_director(specs(1)))
    replies = await client.exchange([request_headers(), request_body(body)], 2)
    assert len(replies) == 1
    imm = replies[0].immediate_response
    assert imm.status.code == status
    err = orjson.loads(imm.body)["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == code and err["message"]
    assert {o.header.key: o.header.raw_value for o in imm.headers.set_headers}["content-type"] == b"application/json"


@pytest.mark.parametrize("body, status, kind", [
    (b"{not json", 400, "invalid_request_error"),
    (b'{"model":"m","max_tokens":4}', 400, "invalid_request_error"),
    (b'{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}', 503, "overloaded_error"),
], ids=["bad-json", "no-messages", "empty-pool"])
async def test_messages_api_errors_use_anthropics_envelope(serve, body: bytes, status: int, kind: str) -> None:
    """The reference's ``BuildErrResponse`` for ``APITypeMessages``: same status, Anthropic's envelope and type."""
    _, client = await serve(make_director(specs(1) if status != 503 else []))
    replies = await client.exchange([request_headers("/v1/messages"), request_body(body)], 2)
    imm = replies[0].immediate_response
    assert imm.status.code == status
    payload = orjson.loads(imm.body)
    assert payload["type"] == "error" and payload["error"]["type"] == kind and payload["error"]["message"]
    assert set(payload) == {"type", "error"} and set(payload["error"]) == {"type", "message"}


async def test_messages_api_usage_is_read_from_its_stream_and_the_model_restored(serve) -> None:
    registry = CollectorRegistry()
    director = make_director(specs(1), metrics=EppMetrics(registry), header_trust=HeaderTrust([MODEL_REWRITE_HEADER]))
    _, client = await serve(director)
    call = client.open()
    await call.write(request_headers("/v1/messages", headers={"x-gateway-model-name-rewrite": "served"}))
    await call.write(request_body(b'{"model":"alias","max_tokens":9,"stream":true,'
                                  b'"messages":[{"role":"user","content":"hi"}]}'))
    await call.read(), await call.read()
    await call.write(response_headers(content_type="text/event-stream"))
    await call.read()
    stream = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"x","content":[],'
              b'"model":"served","usage":{"input_tokens":21,"cache_read_input_tokens":4,"output_tokens":0}}}\n\n'
              b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta",'
              b'"text":"a"},"index":0}\n\n'
              b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
              b'"usage":{"output_tokens":3}}\n\n'  # Anthropic's own shape: no input count here
              b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    echoed = b""
    for i, piece in enumerate([stream[:50], stream[50:200], stream[200:]]):
        await call.write(response_body(piece, eos=i == 2))
        echoed += (await call.read()).response_body.response.body_mutation.streamed_response.body
    assert echoed == stream.replace(b'"model":"served"', b'"model":"alias"')
    labels = {"model_name": "alias", "target_model_name": "served"}
    sample = registry.get_sample_value
    assert (sample("inference_objective_input_tokens_sum", labels), sample("inference_objective_output_tokens_sum",
            labels), sample("inference_objective_prompt_cached_tokens_sum", labels)) == (25, 3, 4)
    call.cancel()


async def test_empty_pool_is_503(serve) -> None:
    _, client = await serve(make_director([]))
    replies = await client.exchange([request_headers(), request_body(CHAT)], 1)
    assert replies[0].immediate_response.status.code == 503
    assert orjson.loads(replies[0].immediate_response.body)["error"]["type"] == "server_error"
    headers = {o.header.key: o.header.raw_value for o in replies[0].immediate_response.headers.set_headers}
    assert headers["x-llm-d-request-dropped-reason"] == b"rejected-no-endpoints"  # the current reference's header


async def test_body_over_the_limit_is_413_from_content_length_before_any_body(serve) -> None:
    _, client = await serve(make_director(specs(1)), body_limit=1000)
    replies = await client.exchange([request_headers(headers={"content-length": "1001"})], 1)
    assert replies[0].immediate_response.status.code == 413


async def test_body_over_the_limit_is_413_while_streaming(serve) -> None:
    _, client = await serve(make_director(specs(1)), body_limit=1000)
    call = client.open()
    await call.write(request_headers())
    await call.write(request_body(b"{" + b" " * 600, eos=False))
    await call.write(request_body(b" " * 600, eos=False))
    reply = await call.read()
    assert reply.immediate_response.status.code == 413
    assert await call.read() is grpc.aio.EOF  # EPP ends the stream after an immediate response
    call.cancel()


async def test_client_routing_headers_are_overwritten_or_removed(serve) -> None:
    _, client = await serve(make_director(specs(1)))
    spoofed = {"x-gateway-destination-endpoint": "6.6.6.6:80", "x-gateway-destination-endpoint-served": "6.6.6.6:80",
               "x-prefiller-host-port": "6.6.6.6:80", "x-encoder-hosts-ports": "6.6.6.6:80"}
    for mode in (FULL_DUPLEX, BUFFERED):
        replies = await client.exchange([request_headers(headers=spoofed, mode=mode), request_body(CHAT)], 2)
        common = replies[0].request_headers.response if mode == FULL_DUPLEX else replies[1].request_body.response
        assert set_headers(common)["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
        assert set(common.header_mutation.remove_headers) == {
            "x-gateway-destination-endpoint-served", "x-prefiller-host-port", "x-encoder-hosts-ports"}
    replies = await client.exchange([request_headers("/v1/models", spoofed, eos=True)], 1)
    common = replies[0].request_headers.response
    assert set_headers(common)["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert "x-prefiller-host-port" in common.header_mutation.remove_headers


async def test_concurrent_streams_are_isolated_a_bad_one_does_not_affect_a_good_one(serve) -> None:
    _, client = await serve(make_director(specs(2)))
    good, bad = client.open(), client.open()
    await good.write(request_headers())
    await bad.write(request_headers())
    await good.write(request_body(CHAT[:10], eos=False))
    await bad.write(request_body(b"{oops", eos=True))
    assert (await bad.read()).immediate_response.status.code == 400
    await good.write(request_body(CHAT[10:], eos=True))
    head = await good.read()
    assert set_headers(head.request_headers.response)["x-gateway-destination-endpoint"].endswith(":8000")
    assert (await good.read()).request_body.response.body_mutation.streamed_response.body == CHAT
    for call in (good, bad):
        call.cancel()


async def test_internal_error_in_a_plugin_is_500_for_that_request_only(serve) -> None:
    director = make_director(specs(2))
    scorer = director.pipeline.handle.plugin("queue-scorer")
    original = scorer.score
    calls = 0

    def flaky(cycle, request, endpoints):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("plugin bug")
        return original(cycle, request, endpoints)

    scorer.score = flaky  # type: ignore[method-assign]
    _, client = await serve(director)
    first = await client.exchange([request_headers(), request_body(CHAT)], 1)
    assert first[0].immediate_response.status.code == 500
    second = await client.exchange([request_headers(), request_body(CHAT)], 1)
    assert second[0].WhichOneof("response") == "request_headers"


async def test_json_response_usage_is_recorded_and_inflight_released(serve) -> None:
    rec = Recorder()
    director = make_director(specs(1), metrics=rec)
    _, client = await serve(director, response_mode="streamed")
    ep = director.datastore.endpoints()[0]
    call = client.open()
    await call.write(request_headers(response_mode=STREAMED))
    await call.write(request_body(CHAT))
    await call.read(), await call.read()
    assert ep.inflight_requests == 1
    await call.write(response_headers(upstream="10.0.0.1:8000"))
    assert (await call.read()).WhichOneof("response") == "response_headers"
    payload = b'{"id":"x","model":"m","usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}'
    await call.write(response_body(payload[:30], eos=False))
    await call.write(response_body(payload[30:], eos=True))
    r1, r2 = await call.read(), await call.read()
    assert r1.response_body == pb.BodyResponse() and r2.response_body == pb.BodyResponse()  # plain CONTINUE
    assert rec.tokens == [("m", "m", 11, 7, None)]
    assert ep.inflight_requests == 0 and rec.running == 0
    call.cancel()


async def test_sse_usage_is_recorded_and_full_duplex_response_chunks_are_echoed(serve) -> None:
    registry = CollectorRegistry()
    director = make_director(specs(1), metrics=EppMetrics(registry))
    _, client = await serve(director)
    call = client.open()
    await call.write(request_headers())
    await call.write(request_body(CHAT))
    await call.read(), await call.read()
    await call.write(response_headers(content_type="text/event-stream"))
    await call.read()
    events = [b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n',
              (b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,'
               b'"prompt_tokens_details":{"cached_tokens":4}}}\n\ndata: [DONE]\n\n')]
    stream = b"".join(events)
    pieces = [stream[:17], stream[17:90], stream[90:]]
    echoed = b""
    for i, piece in enumerate(pieces):
        await call.write(response_body(piece, eos=i == 2))
        reply = await call.read()
        sr = reply.response_body.response.body_mutation.streamed_response
        echoed += sr.body
        assert sr.end_of_stream == (i == 2)
    assert echoed == stream
    labels = {"model_name": "m", "target_model_name": "m"}
    sample = registry.get_sample_value
    assert (sample("inference_objective_input_tokens_sum", labels), sample("inference_objective_output_tokens_sum",
            labels), sample("inference_objective_prompt_cached_tokens_sum", labels)) == (5, 2, 4)
    assert sample("llm_d_epp_request_streaming_itl_seconds_count",
                  {**labels, "fairness_id": "default-flow", "priority": "0"}) == 2  # gaps between 3 chunks
    assert sample("inference_objective_response_sizes_sum", labels) == len(stream)
    assert sample("inference_objective_request_sizes_sum", labels) == len(CHAT)
    call.cancel()


async def test_model_rewrite_goes_upstream_and_is_restored_in_the_response(serve) -> None:
    director = make_director(specs(1), header_trust=HeaderTrust([MODEL_REWRITE_HEADER]))
    _, client = await serve(director)
    call = client.open()
    await call.write(request_headers(headers={"x-gateway-model-name-rewrite": "big-model-v2"}))
    await call.write(request_body(CHAT))
    head, body = await call.read(), await call.read()
    sent = body.request_body.response.body_mutation.streamed_response.body
    assert orjson.loads(sent)["model"] == "big-model-v2"
    assert set_headers(head.request_headers.response)["content-length"] == str(len(sent))
    await call.write(response_headers(extra={"content-length": "70"}))
    reply = await call.read()
    assert list(reply.response_headers.response.header_mutation.remove_headers) == ["content-length"]
    upstream = b'{"model":"big-model-v2","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
    await call.write(response_body(upstream[:12], eos=False))  # splits the model name: held back
    await call.write(response_body(upstream[12:], eos=True))
    out = await call.read()
    restored = out.response_body.response.body_mutation.streamed_response
    assert restored.end_of_stream and orjson.loads(restored.body)["model"] == "m"
    call.cancel()


async def test_a_lone_surrogate_escape_is_routed_and_a_rewritten_body_serializes(serve) -> None:
    # A truncated emoji: the reference (Go) reads it as U+FFFD and routes; EPP answered 400 (orjson refuses it).
    _, client = await serve(make_director(specs(1), header_trust=HeaderTrust([MODEL_REWRITE_HEADER])))
    body = rb'{"model":"m","messages":[{"role":"user","content":"cut \ud83d"}]}'
    plain = await client.exchange([request_headers(), request_body(body)], 2)
    assert plain[0].WhichOneof("response") == "request_headers"
    assert body_chunks(plain)[0].body == body  # no rewrite: the client's bytes go upstream unchanged
    rewritten = await client.exchange([request_headers(headers={"x-gateway-model-name-rewrite": "t"}),
                                       request_body(body)], 2)
    sent = orjson.loads(body_chunks(rewritten)[0].body)
    assert sent["model"] == "t" and sent["messages"][0]["content"] == "cut \ufffd"


async def test_model_rewrite_restored_in_streamed_mode_sse(serve) -> None:
    _, client = await serve(make_director(specs(1), header_trust=HeaderTrust([MODEL_REWRITE_HEADER])))
    call = client.open()
    await call.write(request_headers(headers={"x-gateway-model-name-rewrite": "t"}, response_mode=STREAMED))
    await call.write(request_body(CHAT))
    await call.read(), await call.read()
    await call.write(response_headers(content_type="text/event-stream"))
    await call.read()
    await call.write(response_body(b'data: {"model":"t","x":1}\n\ndata: {"mod', eos=False))
    first = (await call.read()).response_body.response.body_mutation
    assert first.body == b'data: {"model":"m","x":1}\n\n'
    await call.write(response_body(b'el": "t"}\n\n', eos=True))
    second = (await call.read()).response_body.response.body_mutation
    assert second.body == b'data: {"model": "m"}\n\n'
    call.cancel()


async def test_stream_reset_after_routing_releases_inflight_without_counting_an_error(serve) -> None:
    """A reset is Envoy cancelling (the client went away): released, and not an EPP error (as the reference)."""
    rec = Recorder()
    director = make_director(specs(1), metrics=rec)
    server, client = await serve(director)
    ep = director.datastore.endpoints()[0]
    call = client.open()
    await call.write(request_headers())
    await call.write(request_body(CHAT))
    await call.read()
    assert ep.inflight_requests == 1
    call.cancel()
    for _ in range(200):
        if ep.inflight_requests == 0 and server.active_streams == 0:
            break
        await asyncio.sleep(0.01)
    assert ep.inflight_requests == 0 and rec.running == 0 and rec.errors == []


async def test_served_endpoint_reported_by_envoy_moves_the_inflight_count(serve) -> None:
    director = make_director(specs(2), LIST3, waiting={"ep0": 0, "ep1": 5})
    _, client = await serve(director)
    ep0, ep1 = director.datastore.endpoints()
    for kwargs in ({"served": "10.0.0.2:8000"}, {"upstream": "10.0.0.2:8000"}):
        call = client.open()
        await call.write(request_headers())
        await call.write(request_body(CHAT))
        await call.read(), await call.read()
        assert (ep0.inflight_requests, ep1.inflight_requests) == (1, 0)
        await call.write(response_headers(**kwargs))
        await call.read()
        assert (ep0.inflight_requests, ep1.inflight_requests) == (0, 1)
        await call.write(response_body(b"{}", eos=True))
        await call.read()
        assert (ep0.inflight_requests, ep1.inflight_requests) == (0, 0)
        call.cancel()


async def test_served_endpoint_outside_the_pool_is_ignored(serve) -> None:
    director = make_director(specs(1))
    _, client = await serve(director)
    ep = director.datastore.endpoints()[0]
    call = client.open()
    await call.write(request_headers())
    await call.write(request_body(CHAT))
    await call.read(), await call.read()
    await call.write(response_headers(served="6.6.6.6:80"))
    await call.read()
    assert ep.inflight_requests == 1
    call.cancel()
