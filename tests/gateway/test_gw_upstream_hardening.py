"""The gateway as an HTTP client of misbehaving model servers, one section per defect found (numbered as in
the audit). Each model server here is a raw asyncio TCP server that writes the exact bytes under test."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest

from epp.framework.endpoint import Endpoint, EndpointSpec
from epp.gateway._client import LeanUpstream
from epp.gateway._upstream import UpstreamLimits, UpstreamUnavailable

from .helpers import RawServer, StackFactory, chat, random_config

JSON_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


async def _read(up: LeanUpstream, ep: Endpoint) -> bytes:
    resp = await up.post(ep, "/v1/chat/completions", b"{}", {})
    try:
        return await resp.read()
    finally:
        resp.close()


# -- 1. chunk sizes are hex digits only ---------------------------------------------------------------------

BAD_SIZES = [(b"-6", b"XXXX"), (b"+5", b"hello"), (b"0x5", b"hello"), (b" 5", b"hello"), (b"5 ", b"hello"),
             (b"0_5", b"hello"), (b"\t5", b"hello"), (b"", b"hello"), (b'5 ; ext="a b"', b"hello"),
             (b"5\t;x", b"hello")]
BAD_SIZE_IDS = ["negative", "plus-sign", "0x-prefix", "leading-space", "trailing-space", "underscore", "leading-tab",
                "empty", "space-before-extension", "tab-before-extension"]


@pytest.mark.parametrize("layout", ["one-read", "chunk-per-read"])
@pytest.mark.parametrize(("size", "payload"), BAD_SIZES, ids=BAD_SIZE_IDS)
async def test_chunk_size_that_is_not_plain_hex_is_unavailable_and_the_connection_is_dropped(size, payload, layout):
    """A sign, ``0x``, ``_`` or whitespace in a chunk size is a malformed answer, both when the chunk comes in
    its own read (the per-token case) and inside a larger one; a negative size used to loop for ever. Blanks
    before a chunk extension (RFC 9112's BWS) are refused too: llhttp without leniency does."""
    bad = size + b"\r\n" + payload + b"\r\n"
    parts = [JSON_HEAD + b"1\r\nA\r\n", bad, b"0\r\n\r\n"]
    raw = RawServer(parts if layout == "chunk-per-read" else b"".join(parts))
    up = LeanUpstream()
    async with raw as ep:
        for _ in range(2):
            with pytest.raises(UpstreamUnavailable, match="bad chunk size"):
                await asyncio.wait_for(_read(up, ep), 5)
    await up.close()
    assert raw.connections == 2  # never reused after a malformed answer


@pytest.mark.parametrize("size", [b"5", b"05", b"5;ext=1", b"5;ext=\"a b\"", b"5;x;y=z"])
async def test_chunk_size_with_leading_zeros_or_extensions_is_accepted(size):
    raw = RawServer([JSON_HEAD, size + b"\r\nhello\r\n", b"0\r\n\r\n"])
    up = LeanUpstream()
    async with raw as ep:
        assert await _read(up, ep) == b"hello"
        assert await _read(up, ep) == b"hello"
    await up.close()
    assert raw.connections == 1


@pytest.mark.parametrize("transport", ["lean"])
async def test_negative_chunk_size_is_a_502_and_the_gateway_keeps_serving(stack: StackFactory):
    async with RawServer(JSON_HEAD + b"1\r\nA\r\n-6\r\nXXXX", close_after=True) as ep:
        st = await stack(random_config(), [ep.spec], upstream_timeout=5.0)
        status, body = await asyncio.wait_for(st.post("/v1/chat/completions", chat()), 5)
        assert status == 502 and "bad chunk size" in body["error"]["message"]
        assert (await asyncio.wait_for(st.get("/health"), 5))[0] == 200


# -- 2. a relay whose first bytes fill the client's buffer ---------------------------------------------------

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(payload), payload)


@asynccontextmanager
async def scripted(answer: Answer) -> AsyncIterator[Endpoint]:
    """A model server that reads each request (head and Content-Length body) and lets ``answer`` write the
    reply; the connection closes when ``answer`` returns."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            await answer(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield Endpoint(EndpointSpec("scripted", "127.0.0.1", server.sockets[0].getsockname()[1]))
    finally:
        server.close()


async def test_relay_keeps_order_and_pauses_reading_while_the_first_bytes_drain():
    """The bytes already received when the relay starts fill the client's buffer: upstream reading pauses
    until the buffer drained, and every event reaches the sink in order (reads that came in meanwhile used to
    be held back until the end of the stream)."""
    events = [b"data: {\"n\":%d}\n\n" % i for i in range(12)]
    half = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + _chunk(events[0]))
        for i, event in enumerate(events[1:], 1):
            await asyncio.sleep(0.01)
            writer.write(_chunk(event))
            if i == len(events) // 2:
                half.set()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    got: list[bytes] = []
    reading_while_draining: list[bool] = []

    class Sink:
        def __call__(self, payload: bytes, framed: bytes | None) -> bool:
            got.append(payload)
            return len(got) == 1  # the first bytes fill the client's buffer

        def chunk(self, read: bytes, start: int) -> bool:
            return self(read[start:-2], read)

    up = LeanUpstream()
    async with scripted(answer) as ep:
        resp = await up.post(ep, "/v1/chat/completions", b"{}", {})
        conn = resp._conn
        assert conn is not None and conn.transport is not None

        async def drain() -> None:
            reading_while_draining.append(conn.transport.is_reading())
            await half.wait()  # later events arrive while the client drains

        tail = await asyncio.wait_for(resp.pump(Sink(), drain), 5)
        resp.close()
    await up.close()
    assert b"".join(got) + tail == b"".join(events)
    assert reading_while_draining == [False]


# -- 3. response heads ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("head", "error"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\n{}abc", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 5\r\n\r\n{}abc", "Content-Length"),
    ("HTTP/1.1 200 OK\r\nContent-Length: \u00b2\r\n\r\n{}".encode(), "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n{}", "Content-Length"),
    ("HTTP/1.1 \u00b200 OK\r\nContent-Length: 2\r\n\r\n{}".encode(), "status line"),
    (b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\n{}", "status line"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "Transfer-Encoding"),
], ids=["conflicting-lines", "conflicting-list", "superscript-digit", "signed", "5000-digits", "superscript-status",
        "4-digit-status", "chunked-not-final"])
async def test_head_with_bad_framing_is_unavailable(head, error):
    """Conflicting Content-Length values, non-ASCII digits (``str.isdigit`` accepts '²', which ``int``
    rejects: it used to escape ``data_received`` as a fatal protocol error) and a status that is not three
    ASCII digits are malformed answers."""
    up = LeanUpstream()
    async with RawServer(head, close_after=True) as ep:
        with pytest.raises(UpstreamUnavailable, match=error):
            await asyncio.wait_for(_read(up, ep), 5)
    await up.close()


@pytest.mark.parametrize(("head", "error"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\n{}", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
     "both Transfer-Encoding and Content-Length"),
], ids=["identical-lines", "identical-list", "chunked-and-content-length"])
async def test_repeated_or_competing_lengths_are_unavailable_and_the_connection_is_not_reused(head, error):
    """Strict llhttp refuses a repeated Content-Length even with the same value, and Content-Length next to a
    transfer coding (a smuggling pattern): these used to be accepted (chunked winning, without keep-alive)."""
    raw = RawServer(head)
    up = LeanUpstream()
    async with raw as ep:
        for _ in range(2):
            with pytest.raises(UpstreamUnavailable, match=error):
                await asyncio.wait_for(_read(up, ep), 5)
    await up.close()
    assert raw.connections == 2


# -- 4. clients that give up while waiting for a pooled connection ------------------------------------------

@pytest.mark.parametrize("release_first", [False, True], ids=["cancelled-while-waiting", "cancelled-after-slot-freed"])
async def test_cancelled_pool_waiters_are_forgotten(release_first):
    """Requests whose clients went away while waiting for a free connection leave no entry behind, whether
    they were cancelled while the slot was held or after it was handed to the first of them."""
    raw = RawServer(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
                    delay=0.1)
    up = LeanUpstream(UpstreamLimits(max_connections=1))
    async with raw as ep:
        holder = asyncio.create_task(up.post(ep, "/x", b"{}", {}))
        await asyncio.sleep(0.02)
        waiting = [asyncio.create_task(up.post(ep, "/x", b"{}", {})) for _ in range(50)]
        await asyncio.sleep(0.02)
        resp = await holder if release_first else None
        if resp is not None:
            resp.close()  # the answer was read: the slot went to the first waiter
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        if resp is None:
            (await holder).close()
        await asyncio.sleep(0.05)
        assert len(up._waiters) == 0
        assert await asyncio.wait_for(_read(up, ep), 5) == b"{}"  # the slot is still handed out
    await up.close()


# -- 5. a chunk aiohttp's parser never finishes ------------------------------------------------------------

@pytest.mark.parametrize("frontend", ["lean", "aiohttp"])
@pytest.mark.parametrize("transport", ["aiohttp"])
async def test_aiohttp_upstream_malformed_first_chunk_is_a_504_within_the_upstream_timeout(stack, frontend):
    """After a malformed chunk aiohttp's ``readany()`` never returns (its ``sock_read`` timeout does not fire):
    the request used to hang for ever; each read now has its own upstream-timeout deadline."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        await asyncio.sleep(0.1)  # in a later read than the head (with the head, aiohttp reports it)
        writer.write(b"zz\r\nhello\r\n")
        await asyncio.sleep(5)

    async with scripted(answer) as ep:
        st = await stack(random_config(), [ep.spec], frontend=frontend, upstream_timeout=0.5)
        started = time.monotonic()
        status, _ = await asyncio.wait_for(st.post("/v1/chat/completions", chat(stream=True)), 4)
        assert status == 504 and time.monotonic() - started < 3


@pytest.mark.parametrize("frontend", ["lean", "aiohttp"])
@pytest.mark.parametrize("transport", ["aiohttp"])
async def test_aiohttp_upstream_malformed_chunk_mid_stream_drops_the_stream(stack, frontend):
    """The same after the first event reached the client: the client's stream is dropped."""
    event = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + _chunk(event))
        await asyncio.sleep(0.1)
        writer.write(b"zz\r\nhello\r\n")
        await asyncio.sleep(5)

    async def stream(st) -> tuple[int, bytes, bool]:
        got = b""
        async with st.session.post(st.url + "/v1/chat/completions", json=chat(stream=True)) as resp:
            try:
                async for data in resp.content.iter_any():
                    got += data
            except aiohttp.ClientPayloadError:
                return resp.status, got, True
            return resp.status, got, False

    async with scripted(answer) as ep:
        st = await stack(random_config(), [ep.spec], frontend=frontend, upstream_timeout=0.5)
        status, got, broken = await asyncio.wait_for(stream(st), 4)
        assert status == 200 and got == event and broken


# -- 6. Connection-listed response headers -------------------------------------------------------------------

async def test_headers_named_by_the_model_servers_connection_header_are_not_forwarded(stack):
    """RFC 9110 §7.6.1: headers a ``Connection`` header names (in any of its lines) are hop-by-hop."""
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Secret: s3cr3t\r\n"
              b"Connection: keep-alive, X-Secret\r\nConnection: x-other\r\nX-Other: 1\r\nX-Kept: yes\r\n"
              b"Content-Length: 2\r\n\r\n{}")
    async with RawServer(answer) as ep:
        st = await stack(random_config(), [ep.spec])
        async with st.session.post(st.url + "/v1/chat/completions", json=chat()) as resp:
            assert resp.status == 200 and await resp.read() == b"{}"
            assert resp.headers.get("X-Kept") == "yes"
            assert "X-Secret" not in resp.headers and "X-Other" not in resp.headers


# -- 7. hostile answers, parsed by llhttp (epp.http1.response) -------------------------------------------------

def _big_header(size: int) -> bytes:
    return b"X-Big: " + b"a" * size + b"\r\n"


HOSTILE = {
    "head-over-64KB": (b"HTTP/1.1 200 OK\r\n" + _big_header(70_000) + b"Content-Length: 2\r\n\r\n{}", "head larger"),
    "interim-heads-over-64KB": (b"HTTP/1.1 103 Early Hints\r\n" + _big_header(40_000) + b"\r\n"
                                b"HTTP/1.1 103 Early Hints\r\n" + _big_header(40_000) + b"\r\n", "head larger"),
    "bad-chunk-framing": (JSON_HEAD + b"2\r\n{}XX0\r\n\r\n", "chunk"),
    "duplicate-length": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}", "Content-Length"),
    "conflicting-length": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x", "Content-Length"),
    "non-token-name": (b"HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 2\r\n\r\n{}", "header"),
    "control-char": (b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 2\r\n\r\n{}", "header"),
    "bare-lf": (b"HTTP/1.1 200 OK\nContent-Type: application/json\nContent-Length: 2\n\n{}", "status line"),
    "obs-fold": (b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 2\r\n\r\n{}", "header"),
    "longer-than-declared": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}garbage", "more data"),
    "second-answer": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
                      "more data"),
    "protocol-switch": (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n", "switch"),
}


@pytest.mark.parametrize(("answer", "error"), list(HOSTILE.values()), ids=list(HOSTILE))
async def test_hostile_answer_is_unavailable_and_the_connection_is_never_reused(answer, error):
    raw = RawServer(answer)
    up = LeanUpstream()
    async with raw as ep:
        for _ in range(2):
            with pytest.raises(UpstreamUnavailable, match=error):
                await asyncio.wait_for(_read(up, ep), 5)
    await up.close()
    assert raw.connections == 2


@pytest.mark.parametrize("transport", ["lean"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(("answer", "error"), list(HOSTILE.values()), ids=list(HOSTILE))
async def test_hostile_answer_is_an_openai_502_and_the_gateway_keeps_serving(stack: StackFactory, answer, error,
                                                                              stream):
    async with RawServer(answer) as ep:
        st = await stack(random_config(), [ep.spec], upstream_timeout=5.0)
        status, body = await asyncio.wait_for(st.post("/v1/chat/completions", chat(stream=stream)), 5)
        assert status == 502, body
        assert body["error"]["type"] == "server_error" and body["error"]["code"] == "upstream_unavailable"
        assert error in body["error"]["message"]
        assert (await asyncio.wait_for(st.get("/health"), 5))[0] == 200
    assert st.inflight() == 0


@pytest.mark.parametrize("transport", ["lean"])
@pytest.mark.parametrize(("stream", "sent"), [
    (False, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"partial"),
    (True, SSE_HEAD),
], ids=["json-part-of-the-body", "sse-head-only"])
async def test_an_answer_that_stalls_is_an_openai_504_within_the_upstream_timeout(stack: StackFactory, stream, sent):
    """Part of the answer arrives, then nothing, before anything could reach the client: the upstream timeout
    ends the wait."""
    release = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(sent)
        await release.wait()

    async with scripted(answer) as ep:
        st = await stack(random_config(), [ep.spec], upstream_timeout=0.3)
        status, body = await asyncio.wait_for(st.post("/v1/chat/completions", chat(stream=stream)), 5)
        release.set()
    assert status == 504, body
    assert body["error"]["type"] == "server_error" and body["error"]["code"] == "upstream_timeout"


@pytest.mark.parametrize("transport", ["lean"])
async def test_a_stream_that_stalls_after_its_first_event_is_dropped(stack: StackFactory):
    event = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    release = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + _chunk(event))
        await release.wait()

    async def stream(st) -> tuple[int, bytes, bool]:
        got = b""
        async with st.session.post(st.url + "/v1/chat/completions", json=chat(stream=True)) as resp:
            try:
                async for data in resp.content.iter_any():
                    got += data
            except aiohttp.ClientPayloadError:
                return resp.status, got, True
            return resp.status, got, False

    async with scripted(answer) as ep:
        st = await stack(random_config(), [ep.spec], upstream_timeout=0.3)
        status, got, broken = await asyncio.wait_for(stream(st), 5)
        release.set()
    assert status == 200 and got == event and broken
