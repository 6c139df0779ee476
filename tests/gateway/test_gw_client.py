"""The lean upstream client against a raw TCP server: framing split anywhere, keep-alive, limits, timeouts."""

from __future__ import annotations

import asyncio

import pytest

from epp.errors import UpstreamTimeout
from epp.framework.endpoint import Endpoint
from epp.gateway._client import LeanUpstream
from epp.gateway._upstream import UpstreamLimits, UpstreamUnavailable

from .helpers import RawServer

SSE_BODY = b"data: one\n\ndata: two\n\ndata: [DONE]\n\n"


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def _post(up: LeanUpstream, ep: Endpoint, body: bytes = b"{}") -> tuple[int, bytes, bool]:
    resp = await up.post(ep, "/v1/chat/completions?x=1", body, {"content-type": "application/json"})
    try:
        return resp.status, await resp.read(), resp.sse
    finally:
        resp.close()


@pytest.mark.parametrize("step", [0, 1, 3, 7], ids=["whole", "byte-by-byte", "3-bytes", "7-bytes"])
async def test_chunked_sse_split_anywhere_is_reassembled(step):
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
              + _chunked(b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"))
    up = LeanUpstream()
    async with RawServer(answer, step=step) as ep:
        first = await _post(up, ep)
        second = await _post(up, ep)
    await up.close()
    assert first == second == (200, SSE_BODY, True)


async def test_relay_of_whole_chunk_reads_forwards_each_read_as_framed_and_decodes_odd_size_lines():
    """One read per chunk (the relay's fast path): each read is handed over decoded and, when it is exactly
    one chunk, also as received; upper-case hex, leading zeros and chunk extensions decode the same."""
    events = [b"data: one\n\n", b"data: " + b"x" * 300 + b"\n\n", b"data: three\n\n", b"data: [DONE]\n\n"]
    reads = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
             b"%x\r\n%b\r\n" % (len(events[0]), events[0]),
             b"%X\r\n%b\r\n" % (len(events[1]), events[1]),
             b"000%x;ext=1\r\n%b\r\n" % (len(events[2]), events[2]),
             b"%x\r\n%b\r\n0\r\n\r\n" % (len(events[3]), events[3])]
    got: list[tuple[bytes, bytes | None]] = []

    class Sink:
        def __call__(self, payload: bytes, framed: bytes | None) -> bool:
            got.append((payload, framed))
            return False

        def chunk(self, read: bytes, start: int) -> bool:
            got.append((read[start:-2], read))
            return False

    sink = Sink()

    async def drain() -> None:
        raise AssertionError("the sink never asked to pause")

    up = LeanUpstream()
    raw = RawServer(reads)
    async with raw as ep:
        for _ in range(2):  # twice: the connection is reused after a relayed answer
            got.clear()
            resp = await up.post(ep, "/v1/chat/completions", b"{}", {})
            first = await resp.first()
            tail = await resp.pump(sink, drain)
            resp.close()
            assert first + b"".join(p for p, _ in got) + tail == b"".join(events)
            assert (events[1], reads[2]) in got  # a whole-chunk read is forwarded as received
            assert all(framed is None or framed in reads for _, framed in got)
    assert raw.connections == 1
    await up.close()


async def test_content_length_answers_reuse_one_connection_and_send_the_request_as_given():
    raw = RawServer(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    up = LeanUpstream()
    async with raw as ep:
        results = [await _post(up, ep, b'{"a":1}') for _ in range(3)]
    await up.close()
    assert results == [(201, b"{}", False)] * 3
    assert raw.connections == 1
    head, body = raw.requests[0].split(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"content-type: application/json" in head and b"Content-Length: 7" in head and body == b'{"a":1}'


async def test_body_to_end_of_connection_and_connection_close_are_not_reused():
    raw = RawServer(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"x\": 1}", close_after=True)
    up = LeanUpstream()
    async with raw as ep:
        assert await _post(up, ep) == (200, b'{"x": 1}', False)
        assert await _post(up, ep) == (200, b'{"x": 1}', False)
    await up.close()
    assert raw.connections == 2


async def test_pool_limit_queues_requests_beyond_it():
    raw = RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", delay=0.02)
    up = LeanUpstream(UpstreamLimits(max_connections=2))
    async with raw as ep:
        results = await asyncio.gather(*(_post(up, ep) for _ in range(6)))
    await up.close()
    assert [r[:2] for r in results] == [(200, b"ok")] * 6
    assert raw.connections == 2


async def test_silent_server_times_out_and_refused_connection_is_unavailable():
    up = LeanUpstream(upstream_timeout=0.1)
    async with RawServer(b"", delay=5) as ep:
        with pytest.raises(UpstreamTimeout):
            await _post(up, ep)
    with pytest.raises(UpstreamUnavailable):
        await _post(up, ep)  # the server is gone now
    await up.close()


async def test_malformed_answer_is_unavailable():
    up = LeanUpstream()
    async with RawServer(b"SPDY/9 what\r\n\r\n") as ep:
        with pytest.raises(UpstreamUnavailable, match="malformed status line"):
            await _post(up, ep)
    await up.close()


async def test_header_values_cannot_inject_lines():
    raw = RawServer(b"HTTP/1.1 204 No Content\r\n\r\n")
    up = LeanUpstream()
    async with raw as ep:
        resp = await up.post(ep, "/v1/completions", b"", {"x-ok": "1", "x-bad": "a\r\nx-injected: 1"})
        resp.close()
    await up.close()
    assert resp.status == 204
    assert b"x-ok: 1" in raw.requests[0] and b"x-injected" not in raw.requests[0]


@pytest.mark.parametrize("step", [0, 1], ids=["whole", "byte-by-byte"])
async def test_interim_answers_are_skipped_and_the_connection_is_reused(step):
    answer = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n"
              b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    raw = RawServer(answer, step=step)
    up = LeanUpstream()
    async with raw as ep:
        results = [await _post(up, ep) for _ in range(2)]
    await up.close()
    assert results == [(200, b"{}", False)] * 2
    assert raw.connections == 1


async def test_headers_keep_their_order_repeats_and_bytes():
    """Header values come back without surrounding blanks, repeated names stay repeated, and bytes that are not
    UTF-8 survive (surrogate escapes, as before)."""
    raw = RawServer(b"HTTP/1.1 200 OK\r\nX-Tag: a\r\nx-tag:  b \t\r\nX-Raw: caf\xc3\xa9 \xff\r\n"
                    b"Content-Length: 0\r\n\r\n")
    up = LeanUpstream()
    async with raw as ep:
        resp = await up.post(ep, "/v1/completions", b"{}", {})
        resp.close()
    await up.close()
    assert resp.headers.getall("X-Tag") == ["a", "b"]
    assert resp.headers["x-raw"] == "caf\u00e9 \udcff"
