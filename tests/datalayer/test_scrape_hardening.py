"""Model servers that would fool the scraper: compressed pages that inflate past the size limit, and new endpoints
that never answer.

Real servers on 127.0.0.1 answering byte for byte, over both HTTP transports."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import random
import time
import zlib
from typing import AsyncIterator, Awaitable, Callable

import pytest

from epp.datalayer.datastore import Datastore
from epp.datalayer.http import HttpError, MetricsHttpClient
from epp.datalayer.scraper import ScrapeConfig, Scraper
from epp.framework.endpoint import EndpointSpec

from ..conftest import Servers, eventually

LIMIT = 256 * 1024
FAST = ScrapeConfig(interval=0.01, timeout=0.2, max_backoff=0.05, max_page_bytes=LIMIT)


class PageServer:
    """Answers every GET with ``reply`` (whatever the request asked for), or never answers while ``hang``."""

    def __init__(self) -> None:
        self.reply = b""
        self.hang = False
        self.hits = 0
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def serve(self, body: bytes, encoding: str | None = None) -> None:
        extra = f"Content-Encoding: {encoding}\r\n" if encoding else ""
        head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
        self.reply, self.hang = head.encode() + body, False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self.connections += 1
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                self.hits += 1
                while self.hang:
                    await asyncio.sleep(0.01)
                writer.write(self.reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()


@pytest.fixture
async def server() -> AsyncIterator[PageServer]:
    s = PageServer()
    await s.start()
    yield s
    await s.stop()


@pytest.fixture(params=["lean", "aiohttp"])
def transport(request) -> str:
    return request.param


@pytest.fixture
def scrape(datastore, transport, servers: Servers) -> Callable[..., Awaitable[Scraper]]:
    """``await scrape(config)``: a started scraper over ``transport`` (stopped at teardown)."""

    async def make(config: ScrapeConfig = FAST, **kw) -> Scraper:
        return await servers.start(Scraper(datastore, dataclasses.replace(config, transport=transport), **kw))

    return make


def bomb(page: bytes, inflated: int) -> bytes:
    """A gzip body that inflates to ``page`` plus a comment line, ``inflated`` bytes in all (a valid page)."""
    return gzip.compress(page + b"#" + b" " * (inflated - len(page) - 2) + b"\n", 9)


def spec(name: str, port: int) -> EndpointSpec:
    return EndpointSpec(name, "127.0.0.1", port)


# -- decompression bombs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_lean_client_limits_the_inflated_size(server, encoding):
    data = b"x" * 4096
    compress = gzip.compress if encoding == "gzip" else zlib.compress
    client = MetricsHttpClient(accept="text/plain", max_bytes=len(data))
    try:
        server.serve(compress(data), encoding)
        assert await client.get("k", "http", "127.0.0.1", server.port, "/metrics", 1.0) == (200, data)
        server.serve(compress(data + b"x"), encoding)  # one byte over once inflated, tiny on the wire
        with pytest.raises(HttpError, match="inflates to more than 4096 bytes"):
            await client.get("k", "http", "127.0.0.1", server.port, "/metrics", 1.0)
    finally:
        await client.aclose()


async def test_lean_client_still_rejects_truncated_gzip(server):
    client = MetricsHttpClient(accept="text/plain", max_bytes=1000)
    try:
        server.serve(gzip.compress(b"y" * 500)[:-6], "gzip")
        with pytest.raises(HttpError, match="bad gzip body"):
            await client.get("k", "http", "127.0.0.1", server.port, "/metrics", 1.0)
    finally:
        await client.aclose()


async def test_a_gzip_bomb_is_a_failed_scrape(datastore, scrape, server, v1_page):
    # 64x the limit once inflated, a few KB on the wire, sent although EPP asked for identity.
    server.serve(bomb(v1_page, 64 * LIMIT), "gzip")
    ep = datastore.upsert(spec("bomb", server.port))
    s = await scrape()
    await eventually(lambda: ep.scrape_failures >= FAST.failure_threshold, what="bomb counted as failures")
    assert ep.metrics.update_time == 0 and not ep.healthy and s.stats.ok == 0


async def test_a_compressed_page_within_the_limit_still_parses(datastore, scrape, server, v1_page):
    server.serve(bomb(v1_page, LIMIT), "gzip")  # exactly the limit once inflated
    ep = datastore.upsert(spec("fine", server.port))
    await scrape()
    await eventually(lambda: ep.metrics.running == 12, what="compressed page parsed")
    assert ep.healthy


# -- hostile pages (parsed by llhttp: epp.http1.response) ---------------------------------------------------------

HOSTILE = {
    "head-over-64KB": b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\nContent-Length: 2\r\n\r\n{}",
    "bad-chunk-framing": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX0\r\n\r\n",
    "duplicate-length": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab",
    "conflicting-length": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
    "length-and-chunked": b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "non-token-name": b"HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 2\r\n\r\nab",
    "control-char": b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 2\r\n\r\nab",
    "bare-lf": b"HTTP/1.1 200 OK\nContent-Length: 2\n\nab",
    "longer-than-declared": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabcdef",
    "gzip-transfer-coding": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("transport", ["lean"])
@pytest.mark.parametrize("reply", list(HOSTILE.values()), ids=list(HOSTILE))
async def test_a_hostile_page_is_a_failed_scrape_on_a_fresh_connection_each_time(datastore, scrape, server, reply):
    server.reply = reply
    ep = datastore.upsert(spec("hostile", server.port))
    s = await scrape()
    await eventually(lambda: ep.scrape_failures >= FAST.failure_threshold, what="hostile page counted as failures")
    assert ep.metrics.update_time == 0 and not ep.healthy and s.stats.ok == 0
    assert server.connections >= server.hits  # one connection per request: never reused


# -- new endpoints -----------------------------------------------------------------------------------------------


async def test_a_new_endpoint_is_unhealthy_until_its_first_scrape(datastore, scrape, server, v1_page):
    await scrape(dataclasses.replace(FAST, staleness=2.0, failure_threshold=3))
    server.hang = True  # accepts, never answers: before, healthy with all-zero metrics for `staleness`
    ep = datastore.upsert(spec("new", server.port))
    assert not ep.healthy
    await eventually(lambda: ep.scrape_failures >= 1, what="a timed-out scrape")
    assert not ep.healthy
    server.serve(v1_page)
    await eventually(lambda: ep.healthy, what="healthy after the first good scrape")
    assert ep.metrics.running == 12


async def test_endpoints_present_at_start_wait_for_their_first_scrape(datastore, scrape, server, v1_page):
    server.hang = True
    ep = datastore.upsert(spec("early", server.port))  # discovery starts before the scraper
    assert ep.healthy  # no scraper yet: nothing says otherwise
    await scrape()
    assert not ep.healthy
    server.serve(v1_page)
    await eventually(lambda: ep.healthy, what="healthy after the first good scrape")


async def test_a_restarted_scraper_judges_endpoints_by_their_last_metrics(datastore, scrape, server, v1_page):
    server.serve(v1_page)
    ep = datastore.upsert(spec("a", server.port))
    s = await scrape(dataclasses.replace(FAST, staleness=0.3))
    await eventually(lambda: ep.healthy and ep.metrics.update_time > 0, what="first scrape")
    await s.stop()
    await s.start()
    assert ep.healthy  # its metrics are a few ms old
    await s.stop()
    server.hang = True
    await asyncio.sleep(0.4)
    await s.start()
    assert not ep.healthy  # its metrics are older than `staleness`


def test_without_a_scraper_endpoints_are_healthy():
    assert Datastore("p").upsert(spec("a", 1)).healthy


class _Latest(random.Random):
    """An rng whose every draw is the latest allowed: the worst case for the first scrape's offset."""

    def uniform(self, a: float, b: float) -> float:
        return b


async def test_a_new_endpoint_is_scraped_at_once(datastore, scrape, server, v1_page):
    server.serve(v1_page)
    await scrape(dataclasses.replace(FAST, interval=5.0), rng=_Latest())
    added = time.monotonic()
    ep = datastore.upsert(spec("new", server.port))
    await eventually(lambda: ep.metrics.update_time > 0, timeout=1.0, what="a first scrape within 1 s, not 5")
    assert time.monotonic() - added < 1.0 and server.hits == 1 and ep.healthy
