"""The scraper's lean HTTP/1.1 client against raw TCP servers on 127.0.0.1 that answer byte for byte."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from typing import AsyncIterator, Awaitable, Callable

import pytest

from epp.datalayer.http import HttpError, MetricsHttpClient

from ..conftest import Servers


class RawServer:
    """Answers each request on a connection with the next scripted reply (bytes, or a callable for effects)."""

    def __init__(self, replies: list[bytes | Callable[[asyncio.StreamWriter], None]]) -> None:
        self.replies = replies
        self.requests: list[bytes] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                reply = self.replies.pop(0)
                if callable(reply):
                    reply(writer)
                    return
                writer.write(reply)
                await writer.drain()
            await reader.read()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()


@pytest.fixture
def serve(servers: Servers) -> Callable[..., Awaitable[RawServer]]:
    """``await serve(*replies)`` -> a started RawServer answering ``replies`` in turn; stopped after."""

    async def make(*replies: bytes | Callable[[asyncio.StreamWriter], None]) -> RawServer:
        return await servers.start(RawServer(list(replies)))

    return make


@pytest.fixture
async def client() -> AsyncIterator[MetricsHttpClient]:
    c = MetricsHttpClient(accept="text/plain", max_bytes=1000)
    yield c
    await c.aclose()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra) + body


async def get(client: MetricsHttpClient, server: RawServer, key: str = "k", timeout: float = 1.0):
    return await client.get(key, "http", "127.0.0.1", server.port, "/metrics", timeout)


async def test_content_length_and_keep_alive_reuse(client, serve):
    server = await serve(ok(b"a 1\n"), ok(b"a 2\n"), ok(b""))
    assert await get(client, server) == (200, b"a 1\n")
    assert await get(client, server) == (200, b"a 2\n")
    assert await get(client, server) == (200, b"")
    assert server.connections == 1
    assert server.requests[0].startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Accept-Encoding: identity" in server.requests[0]


async def test_chunked_with_extensions_and_trailers(client, serve):
    body = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n"
    server = await serve(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body,
                         b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    assert await get(client, server) == (200, b"hello, world")
    assert await get(client, server) == (200, b"abc")
    assert server.connections == 1


async def test_body_until_close_and_connection_close(client, serve):
    def http10(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nno length, read to EOF")
        writer.close()

    server = await serve(http10)
    assert await get(client, server) == (200, b"no length, read to EOF")
    server = await serve(ok(b"x", b"Connection: close\r\n"), ok(b"y"))
    assert await get(client, server) == (200, b"x")
    assert await get(client, server) == (200, b"y")
    assert server.connections == 2


@pytest.mark.parametrize("encoding,compress", [(b"gzip", gzip.compress), (b"deflate", zlib.compress)])
async def test_compressed_bodies(serve, encoding, compress):
    c = MetricsHttpClient(accept="text/plain", compression=True)
    packed = compress(b"vllm:num_requests_running 1\n" * 20)
    server = await serve(ok(packed, b"Content-Encoding: " + encoding + b"\r\n"))
    try:
        assert await get(c, server) == (200, b"vllm:num_requests_running 1\n" * 20)
        assert b"Accept-Encoding: gzip" in server.requests[0]
    finally:
        await c.aclose()


@pytest.mark.parametrize("reply,match", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n", "larger than 1000"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"3e8\r\n" + b"x" * 1000 + b"\r\n1\r\nx\r\n",
     "larger than 1000"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "status line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n", "header"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Encoding: gzip\r\n\r\nxx", "gzip"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Encoding: br\r\n\r\nxx", "Content-Encoding"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nxxxx", "more data"),
], ids=["too-long", "chunked-too-long", "not-http", "bad-length", "bad-header", "bad-chunk", "bad-gzip",
        "unknown-encoding", "extra-data"])
async def test_malformed_responses_fail_and_drop_the_connection(client, serve, reply, match):
    server = await serve(reply, ok(b"fine"))
    with pytest.raises(HttpError, match=match):
        await get(client, server)
    server.replies = [ok(b"fine")]
    assert await get(client, server) == (200, b"fine")  # a fresh connection works


async def test_timeout_and_reset(client, serve):
    server = await serve(lambda w: w.transport.abort())
    with pytest.raises(HttpError, match="closed"):
        await get(client, server)
    server = await serve(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    with pytest.raises(TimeoutError):
        await get(client, server, timeout=0.1)


async def test_refused(client):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HttpError, match="cannot connect"):
        await client.get("k", "http", "127.0.0.1", port, "/metrics", 1.0)


async def test_idle_keep_alive_closed_by_server_is_retried_once(client, serve):
    def close_without_answer(writer: asyncio.StreamWriter) -> None:
        writer.close()  # the server's idle timeout raced our request on the kept-alive connection

    server = await serve(ok(b"first"), close_without_answer, ok(b"second"), close_without_answer)
    assert await get(client, server) == (200, b"first")
    assert await get(client, server) == (200, b"second")  # retried on a fresh connection
    assert server.connections == 2
    with pytest.raises(HttpError, match="closed"):  # a fresh connection failing is not retried
        client.close("k")
        await get(client, server)


async def test_status_without_body_and_separate_keys(client, serve):
    server = await serve(b"HTTP/1.1 204 No Content\r\n\r\n", ok(b"z"))
    assert await get(client, server) == (204, b"")
    other = await serve(ok(b"other"))
    assert await get(client, other, key="k2") == (200, b"other")
    assert await get(client, server) == (200, b"z")
    client.close("k")
    client.close("missing")


async def test_interim_answers_are_skipped_and_a_head_in_single_bytes_is_parsed(client, serve):
    """1xx answers before the real one are skipped (they used to be taken for the answer); a reply written a
    byte at a time parses the same, and the connection is kept."""
    def one_byte_at_a_time(reply: bytes) -> Callable[[asyncio.StreamWriter], None]:
        def write(writer: asyncio.StreamWriter) -> None:
            for i in range(len(reply)):
                writer.write(reply[i:i + 1])
        return write

    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
    server = await serve(interim + ok(b"a 1\n"), ok(b"a 2\n"))
    assert await get(client, server) == (200, b"a 1\n")
    assert await get(client, server) == (200, b"a 2\n")
    assert server.connections == 1
    server = await serve(one_byte_at_a_time(ok(b"b 1\n", b"X-Long: " + b"v" * 5000 + b"\r\n")))
    assert await get(client, server, key="k2") == (200, b"b 1\n")
