"""The ext_proc protocol, the request's life after routing: session affinity, one request per stream, trailers,
refusals counted, reporter metadata, undecodable messages and the response-headers marker (a real grpc.aio client
against a real ExtProcServer, no Envoy)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from epp.extproc.protocol import BodySendMode, pb
from epp.headers import MODEL_REWRITE_HEADER, HeaderTrust
from epp.metrics.families import EppMetrics

from .helpers import (
    BUFFERED,
    CHAT,
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


async def test_request_trailers_end_the_body_in_full_duplex(serve) -> None:
    _, client = await serve(make_director(specs(1)))
    trailers = pb.ProcessingRequest()
    trailers.request_trailers.trailers.headers.add(key="x-t", raw_value=b"1")
    replies = await client.exchange([request_headers(), request_body(CHAT, eos=False), trailers], 3)
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body", "request_trailers"]
    assert not replies[1].request_body.response.body_mutation.streamed_response.end_of_stream


async def test_streamed_request_body_mode_is_refused_with_an_explanation(serve) -> None:
    _, client = await serve(make_director(specs(1)))
    replies = await client.exchange([request_headers(mode=STREAMED)], 1)
    imm = replies[0].immediate_response
    assert imm.status.code == 500 and b"FULL_DUPLEX_STREAMED" in imm.body


async def test_with_response_mode_none_the_stream_end_is_a_normal_completion(serve) -> None:
    rec = Recorder()
    director = make_director(specs(1), metrics=rec)
    server, client = await serve(director)
    replies = await client.exchange([request_headers(mode=BUFFERED, response_mode=BodySendMode.NONE),
                                     request_body(CHAT)], 2)
    assert replies[1].WhichOneof("response") == "request_body"
    ep = director.datastore.endpoints()[0]
    for _ in range(200):
        if ep.inflight_requests == 0 and server.active_streams == 0:
            break
        await asyncio.sleep(0.01)
    assert ep.inflight_requests == 0 and rec.running == 0 and rec.errors == []


async def test_upstream_error_status_completes_the_request_as_an_error(serve) -> None:
    rec = Recorder()
    director = make_director(specs(1), metrics=rec)
    _, client = await serve(director, response_mode="streamed")
    call = client.open()
    await call.write(request_headers(response_mode=STREAMED))
    await call.write(request_body(CHAT))
    await call.read(), await call.read()
    await call.write(response_headers(status=503))
    await call.read()
    await call.write(response_body(b'{"error":{"message":"overloaded"}}', eos=True))
    await call.read()
    assert rec.errors == [("m", "m", "ModelServerError")] and rec.tokens == []
    assert director.datastore.endpoints()[0].inflight_requests == 0
    call.cancel()


SESSION_CONFIG = """
plugins: [{type: session-affinity-scorer}]
schedulingProfiles: [{name: default, plugins: [{pluginRef: session-affinity-scorer}]}]
"""


async def test_session_affinity_token_is_set_on_the_response_and_pins_the_next_request(serve) -> None:
    """session-affinity-scorer's x-session-token reaches the client through the response-headers reply, and a
    request carrying it goes back to the same endpoint."""
    director = make_director(specs(4), SESSION_CONFIG)
    _, client = await serve(director)
    call = client.open()
    await call.write(request_headers())
    await call.write(request_body(CHAT))
    head, _ = await call.read(), await call.read()
    first = set_headers(head.request_headers.response)["x-gateway-destination-endpoint"]
    await call.write(response_headers())
    reply = await call.read()
    token = set_headers(reply.response_headers.response)["x-session-token"]
    call.cancel()
    for _ in range(5):
        call = client.open()
        await call.write(request_headers(headers={"x-session-token": token}))
        await call.write(request_body(CHAT))
        head, _ = await call.read(), await call.read()
        assert set_headers(head.request_headers.response)["x-gateway-destination-endpoint"] == first
        call.cancel()


async def _released(server, director) -> None:  # type: ignore[no-untyped-def]
    for _ in range(300):
        if all(ep.inflight_requests == 0 for ep in director.datastore.endpoints()) and server.active_streams == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the stream's request was never released")


@pytest.mark.parametrize("sequence", ["body-after-eos", "second-request"])
async def test_a_second_request_on_one_stream_is_refused_and_the_first_released(serve, sequence: str) -> None:
    """Envoy sends one request per stream. A client that sends a body after the body ended, or a second request,
    gets INVALID_ARGUMENT, and the request it had routed is completed (in-flight count and running gauge back to
    zero), instead of being overwritten and held forever."""
    rec = Recorder()
    director = make_director(specs(2), metrics=rec)
    server, client = await serve(director)
    call = client.open()
    await call.write(request_headers())
    await call.write(request_body(CHAT))
    await call.read(), await call.read()  # headers reply and the streamed body: routed
    assert sum(ep.inflight_requests for ep in director.datastore.endpoints()) == 1
    extra = [request_headers(), request_body(CHAT)] if sequence == "second-request" else [request_body(CHAT)]
    try:
        for msg in extra:
            await call.write(msg)  # EPP may end the call before the last write
        while await call.read() is not grpc.aio.EOF:
            pass
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        # grpc.aio reports a write to a call EPP has already ended either as the call's error or, when the call
        # had finished before the write began, as InvalidStateError ("RPC already finished")
        pass
    # INVALID_ARGUMENT (the exact status is pinned over raw HTTP/2 in test_native_h2; grpcio's client may report
    # its own failed write instead when EPP ends the call first)
    assert await call.code() != grpc.StatusCode.OK
    await _released(server, director)
    assert rec.running == 0 and rec.requests == 1


async def test_buffered_body_followed_by_trailers_is_routed(serve) -> None:
    """In BUFFERED mode the one body message is the whole body; end_of_stream is false when trailers follow
    (an HTTP/2 or gRPC client). It is routed, not mistaken for a body over Envoy's buffer."""
    director = make_director(specs(2))
    _, client = await serve(director)
    call = client.open()
    await call.write(request_headers(mode=BUFFERED))
    await call.read()
    await call.write(request_body(CHAT, eos=False))
    reply = await call.read()
    assert reply.WhichOneof("response") == "request_body"
    assert set_headers(reply.request_body.response)["x-gateway-destination-endpoint"].startswith("10.0.0.")
    trailers = pb.ProcessingRequest()
    trailers.request_trailers.trailers.headers.add(key="x-t", raw_value=b"1")
    await call.write(trailers)
    assert (await call.read()).WhichOneof("response") == "request_trailers"
    call.cancel()


async def test_requests_refused_before_routing_are_counted_by_error_code(serve) -> None:
    """A body that does not parse (400) and one over the limit (413) are counted in the error metric with empty
    model labels, as the reference counts any request that ends in an error."""
    rec = Recorder()
    director = make_director(specs(1), metrics=rec)
    _, client = await serve(director)
    bad = await client.exchange([request_headers(), request_body(b"{not json")], 1)
    assert bad[0].immediate_response.status.code == 400
    big = await client.exchange([request_headers(headers={"content-length": str(11 << 20)})], 1)
    assert big[0].immediate_response.status.code == 413
    assert rec.errors == [("", "", "BadRequest"), ("", "", "PayloadTooLarge")]


async def test_response_mode_none_records_the_request_size(serve) -> None:
    metrics = EppMetrics(CollectorRegistry())
    director = make_director(specs(1), metrics=metrics)
    server, client = await serve(director)
    await client.exchange([request_headers(mode=BUFFERED, response_mode=BodySendMode.NONE), request_body(CHAT)], 2)
    await _released(server, director)
    assert metrics.registry.get_sample_value("inference_objective_request_sizes_sum",
                                             {"model_name": "m", "target_model_name": "m"}) == len(CHAT)


REPORTER_CONFIG = (Path(__file__).parent.parent / "fixtures" / "conformance-configs" /
                   "request-attribute-reporter.yaml").read_text()


def _cost(reply: pb.ProcessingResponse) -> float | None:
    fields = reply.dynamic_metadata.fields
    if "envoy.lb" not in fields:
        return None
    return fields["envoy.lb"].struct_value.fields["x-gateway-inference-request-cost"].number_value


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_request_attribute_reporter_metadata_rides_on_the_last_response_reply(serve, sse: bool) -> None:
    """The reference's TestRequestAttributeReporter(Streaming) config: usage.completion_tokens from the answer
    (JSON body, or the SSE usage chunk) comes back as envoy.lb dynamic metadata on the last body reply only."""
    director = make_director(specs(1), REPORTER_CONFIG)
    _, client = await serve(director)
    call = client.open()
    await call.write(request_headers())
    await call.write(request_body(CHAT))
    await call.read(), await call.read()
    await call.write(response_headers(content_type="text/event-stream" if sse else "application/json"))
    await call.read()
    if sse:
        first = b'data: {"choices":[{"text":"a"}]}\n\n'
        last = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\ndata: [DONE]\n\n'
    else:
        first, last = b'{"choices":[],"usage":{"prompt_to', b'kens":7,"completion_tokens":3}}'
    await call.write(response_body(first, eos=False))
    assert _cost(await call.read()) is None
    await call.write(response_body(last, eos=True))
    reply = await call.read()
    assert reply.response_body.response.body_mutation.streamed_response.end_of_stream
    assert _cost(reply) == 3.0
    call.cancel()


async def test_request_attribute_reporter_metadata_in_buffered_response_mode(serve) -> None:
    """With a BUFFERED response the body reply is a plain CONTINUE; the metadata still rides on it."""
    director = make_director(specs(1), REPORTER_CONFIG)
    _, client = await serve(director)
    replies = await client.exchange([
        request_headers(mode=BUFFERED, response_mode=BUFFERED), request_body(CHAT), response_headers(),
        response_body(b'{"usage":{"prompt_tokens":7,"completion_tokens":4}}', eos=True)], 4)
    assert replies[3].WhichOneof("response") == "response_body" and _cost(replies[3]) == 4.0


UNDECODABLE = b"\xff\xff\xff\xff\xff"
"""Bytes that are no protobuf message (a truncated varint field): what a broken client, not Envoy, would send."""


@pytest.mark.parametrize("routed", [False, True], ids=["before-routing", "after-routing"])
async def test_an_undecodable_message_ends_the_call_with_invalid_argument_and_releases_the_request(
        serve, routed: bool) -> None:
    """A message that is no ProcessingRequest ends the call with INVALID_ARGUMENT on both transports, like any
    other protocol violation: no ImmediateResponse (it is not the HTTP request's error, so nothing is counted in
    the error metric), and a request already routed is completed (in-flight count and running gauge back to
    zero, no stream left open)."""
    rec = Recorder()
    director = make_director(specs(2), metrics=rec)
    server, client = await serve(director)
    call = client.open_raw()
    await call.write(request_headers().SerializeToString())
    if routed:
        await call.write(request_body(CHAT).SerializeToString())
        await call.read(), await call.read()  # headers reply and the streamed body: routed
        assert sum(ep.inflight_requests for ep in director.datastore.endpoints()) == 1
    await call.write(UNDECODABLE)
    replies = []
    with pytest.raises(grpc.aio.AioRpcError):
        while (reply := await call.read()) is not grpc.aio.EOF:
            replies.append(reply)
    assert replies == []
    assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await call.details() == "cannot decode ProcessingRequest"
    await _released(server, director)
    assert rec.running == 0 and rec.requests == int(routed) and rec.errors == []


MARKER = "x-went-into-resp-headers"


def _common(reply: pb.ProcessingResponse) -> pb.CommonResponse:
    """The CommonResponse of a headers or body reply."""
    return getattr(reply, reply.WhichOneof("response")).response


@pytest.mark.parametrize("case", ["routed", "rewrite", "session", "bodiless"])
async def test_the_response_headers_reply_and_only_it_carries_the_reference_marker(serve, case: str) -> None:
    """As the reference: the response-headers reply sets ``x-went-into-resp-headers: true``, whether EPP adds
    nothing else there (a routed request, one routed without a body), removes content-length (a model rewrite)
    or sets a plugin's header (session-affinity's token); no other reply carries it."""
    director = make_director(specs(2), SESSION_CONFIG if case == "session" else None,
                             header_trust=HeaderTrust([MODEL_REWRITE_HEADER]))  # a trusted gateway's rewrite
    _, client = await serve(director)
    if case == "bodiless":
        request = [request_headers("/v1/models", eos=True)]
    else:
        rewrite = {"x-gateway-model-name-rewrite": "t"} if case == "rewrite" else {}
        request = [request_headers(headers=rewrite), request_body(CHAT)]
    replies = await client.exchange([*request, response_headers(), response_body(b"{}", eos=True)],
                                    len(request) + 2)
    kinds = [r.WhichOneof("response") for r in replies]
    assert kinds[-2:] == ["response_headers", "response_body"]
    mutation = replies[-2].response_headers.response.header_mutation
    assert set_headers(replies[-2].response_headers.response)[MARKER] == "true"
    assert mutation.set_headers[0].append_action == mutation.set_headers[0].OVERWRITE_IF_EXISTS_OR_ADD
    if case == "rewrite":
        assert list(mutation.remove_headers) == ["content-length"]
    if case == "session":
        assert set(set_headers(replies[-2].response_headers.response)) == {MARKER, "x-session-token"}
    others = replies[:-2] + replies[-1:]
    assert all(MARKER not in set_headers(_common(r)) for r in others)
