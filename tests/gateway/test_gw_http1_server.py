"""The lean HTTP/1.1 front end (``GatewayServer(frontend="lean")``) seen from a raw TCP socket.

Every test writes bytes on ``asyncio.open_connection`` and reads the answers with ``h11`` (python-hyper's
HTTP/1.1 state machine), an implementation independent of the server's, so framing (Content-Length, chunked,
read-until-close) and keep-alive are checked by a second parser rather than by the code under test. Interim
``100 Continue`` heads and connection closes are checked on the raw bytes. The server proxies to simulated
vLLM servers (``epp_sim``) through a real Director, as in production.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import h11
import orjson
import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.gateway import GatewayServer, make_gateway_app
from epp.gateway._frontend import ClientLimits
from epp.scheduling.director import Director
from epp_sim import SimConfig, TimeModel

from ..conftest import Servers, eventually
from .helpers import MODEL, RawServer, Recorder, Stack, chat, random_config, sim, spec_for

READ_TIMEOUT = 5.0
"""Seconds any single read may take before the test fails (a server bug fails, never hangs the suite)."""

BODY_LIMIT = 4096


# -- a raw client with h11 as the response parser ------------------------------------------------------------


def raw_request(method: str, target: str, body: bytes | None = None, headers: tuple[tuple[str, str], ...] = (),
                version: str = "1.1", length: bool = True) -> bytes:
    """An HTTP request as bytes (``Host`` first; ``Content-Length`` added for a body unless ``length=False``)."""
    lines = [f"{method} {target} HTTP/{version}", "Host: 127.0.0.1"]
    if body is not None and length:
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def json_request(path: str, payload: dict[str, Any], **kw: Any) -> bytes:
    return raw_request("POST", path, orjson.dumps(payload), (("Content-Type", "application/json"),
                                                             *kw.pop("headers", ())), **kw)


def chunked(*parts: bytes) -> bytes:
    """``parts`` as a chunked body (with the last, empty chunk)."""
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@dataclass
class Answer:
    """One response as h11 parsed it."""

    status: int
    version: bytes
    headers: list[tuple[str, str]]
    body: bytes
    chunks: list[h11.Data] = field(default_factory=list)
    interim: list[int] = field(default_factory=list)
    must_close: bool = False  # h11's verdict: the connection cannot carry another request

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name]
        return values[-1] if values else None

    def json(self) -> Any:
        return orjson.loads(self.body)

    def sse_events(self) -> list[str]:
        return [e for e in self.body.decode().split("\n\n") if e.strip()]


class Conn:
    """One client connection. Requests are written as raw bytes; each answer is parsed by an h11 client whose
    own request is only a shadow that tells it what the answer's framing depends on (HEAD, Connection: close)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def shadow(self, method: str = "POST", close: bool = False) -> None:
        """Tell h11 a request with this method was sent (its bytes are discarded; ours were written raw)."""
        if self.h.our_state is h11.DONE and self.h.their_state is h11.DONE:
            self.h.start_next_cycle()
        headers = [("Host", "127.0.0.1")] + ([("Connection", "close")] if close else [])
        self.h.send(h11.Request(method=method, target="/", headers=headers))
        self.h.send(h11.EndOfMessage())

    async def event(self, timeout: float = READ_TIMEOUT) -> Any:
        """The next h11 event, reading from the socket as needed."""
        while True:
            try:
                ev = self.h.next_event()
            except h11.RemoteProtocolError as exc:
                raise AssertionError(f"invalid HTTP from the server, or closed without an answer: {exc}") from exc
            if ev is not h11.NEED_DATA:
                return ev
            try:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
            except ConnectionResetError:
                data = b""
            self.h.receive_data(data)

    async def answer(self, method: str = "POST", close: bool = False, timeout: float = READ_TIMEOUT,
                     shadow: bool = True) -> Answer:
        """Read one complete response (h11 validates its framing)."""
        if shadow:
            self.shadow(method, close)
        interim: list[int] = []
        while True:
            ev = await self.event(timeout)
            if isinstance(ev, h11.InformationalResponse):
                interim.append(ev.status_code)
                continue
            assert isinstance(ev, h11.Response), f"expected a response, got {ev!r}"
            break
        answer = Answer(ev.status_code, ev.http_version,
                        [(k.decode().lower(), v.decode()) for k, v in ev.headers], b"", interim=interim)
        body = bytearray()
        while True:
            ev = await self.event(timeout)
            if isinstance(ev, h11.Data):
                answer.chunks.append(ev)
                body += ev.data
            elif isinstance(ev, h11.EndOfMessage):
                break
            else:
                pytest.fail(f"unexpected event in a response body: {ev!r}")
        answer.body = bytes(body)
        answer.must_close = self.h.their_state in (h11.MUST_CLOSE, h11.CLOSED)
        return answer

    async def request(self, data: bytes, method: str = "POST", close: bool = False,
                      timeout: float = READ_TIMEOUT) -> Answer:
        await self.send(data)
        return await self.answer(method, close, timeout)

    async def closed_by_server(self, timeout: float = 2.0) -> bytes:
        """Wait for the server to close; returns whatever bytes came before the close (fails on a timeout)."""
        try:
            return await asyncio.wait_for(self.reader.read(), timeout)
        except ConnectionResetError:
            return b""

    def abort(self) -> None:
        self.writer.transport.abort()

    def close(self) -> None:
        self.writer.close()


def assert_openai_error(answer: Answer, status: int, type_: str | None = None, code: str | None = None) -> None:
    assert answer.status == status, (answer.status, answer.body)
    assert (answer.header("content-type") or "").startswith("application/json")
    err = answer.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    if type_ is not None:
        assert err["type"] == type_, err
    if code is not None:
        assert err["code"] == code, err


# -- the gateway under test ----------------------------------------------------------------------------------


@dataclass
class Gw:
    stack: Stack
    sim: Any
    stopped: bool = False

    @property
    def port(self) -> int:
        return self.stack.server.port

    @property
    def server(self) -> GatewayServer:
        return self.stack.server

    def inflight(self) -> int:
        return self.stack.inflight()

    async def conn(self) -> Conn:
        return await Conn.open(self.port)

    async def stop(self) -> None:
        self.stopped = True
        await self.server.stop()


GwFactory = Callable[..., Awaitable[Gw]]


def slow_sim(step: float = 0.02) -> SimConfig:
    """A model server that takes ``step`` seconds per output token (real time)."""
    return SimConfig(model=MODEL, time_scale=1.0, time_model=TimeModel(step_overhead_s=step))


@pytest.fixture
def gateway(sims, registry, servers: Servers) -> GwFactory:
    """``await gateway(sim_config=None, keepalive_timeout=75.0, shutdown_timeout=10.0, client_limits=None,
    **make_gateway_app kw)``: one simulated server behind a gateway served by the lean front end on 127.0.0.1:0."""

    async def start(sim_config: SimConfig | None = None, *, keepalive_timeout: float = 75.0,
                    shutdown_timeout: float = 10.0, client_limits: ClientLimits | None = None, **kw: Any) -> Gw:
        [server] = await sims(sim_config or sim())
        kw.setdefault("transport", "lean")
        kw.setdefault("body_limit", BODY_LIMIT)
        pipeline = build_pipeline(*load_raw(random_config()), registry)
        recorder = Recorder()
        pipeline.response_complete.append(recorder)
        datastore = Datastore()
        datastore.replace_all([spec_for(server)])
        datastore.mark_synced()
        director = Director(pipeline, datastore)
        gw_server = GatewayServer(make_gateway_app(director, **kw), "127.0.0.1", 0, frontend="lean",
                                  keepalive_timeout=keepalive_timeout, shutdown_timeout=shutdown_timeout,
                                  client_limits=client_limits)
        await gw_server.start()
        session = aiohttp.ClientSession()
        gw = Gw(Stack(director, datastore, gw_server, recorder, session), server)
        servers.defer(lambda: None if gw.stopped else gw_server.stop())  # unless the test stopped it
        servers.defer(session.close)
        return gw

    return start


@pytest.fixture
async def gw(gateway) -> Gw:
    return await gateway()


def completion(prompt: str = "Once upon a time", **kw: Any) -> dict[str, Any]:
    kw.setdefault("max_tokens", 5)
    return {"model": MODEL, "prompt": prompt, **kw}


async def health_ok(port: int) -> None:
    """A new connection gets ``GET /health`` answered."""
    conn = await Conn.open(port)
    try:
        answer = await conn.request(raw_request("GET", "/health"), "GET")
        assert answer.status == 200 and answer.json() == {"status": "ok"}
    finally:
        conn.close()


# -- 1, 2: keep-alive and pipelining -------------------------------------------------------------------------


async def test_sequential_requests_share_one_connection(gw):
    conn = await gw.conn()
    answers = [
        await conn.request(raw_request("GET", "/health"), "GET"),
        await conn.request(json_request("/v1/completions", completion())),
        await conn.request(json_request("/v1/chat/completions", chat(max_tokens=4))),
        await conn.request(raw_request("GET", "/v1/models"), "GET"),
        await conn.request(json_request("/v1/completions", completion("again"))),
    ]
    assert [a.status for a in answers] == [200] * 5
    assert not any(a.must_close for a in answers)
    assert answers[0].json() == {"status": "ok"}
    assert answers[1].json()["object"] == "text_completion" and answers[4].json()["object"] == "text_completion"
    assert answers[2].json()["object"] == "chat.completion"
    assert [m["id"] for m in answers[3].json()["data"]] == [MODEL]
    conn.close()


async def test_pipelined_requests_are_answered_in_order(gw):
    conn = await gw.conn()
    await conn.send(json_request("/v1/completions", completion(max_tokens=20, stream=True),
                                 headers=(("x-request-id", "r1"),))
                    + raw_request("GET", "/health")
                    + json_request("/v1/chat/completions", chat(max_tokens=2), headers=(("x-request-id", "r3"),)))
    first = await conn.answer("POST")
    second = await conn.answer("GET")
    third = await conn.answer("POST")
    assert (first.status, second.status, third.status) == (200, 200, 200)
    assert first.header("x-request-id") == "r1" and first.sse_events()[-1] == "data: [DONE]"
    assert second.json() == {"status": "ok"}
    assert third.header("x-request-id") == "r3" and third.json()["object"] == "chat.completion"
    # and the connection still carries a fourth request
    assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200
    conn.close()


# -- 3, 4: Expect: 100-continue and chunked request bodies ---------------------------------------------------


async def test_expect_100_continue_is_answered_before_the_body_is_sent(gw):
    body = orjson.dumps(completion())
    conn = await gw.conn()
    head = raw_request("POST", "/v1/completions", body, (("Content-Type", "application/json"),
                                                          ("Expect", "100-continue")))
    await conn.send(head[:-len(body)])  # the head only
    interim = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
    assert re.match(rb"HTTP/1\.1 100 Continue\r\n", interim), interim
    await conn.send(body)
    answer = await conn.answer("POST")
    assert answer.status == 200 and answer.json()["object"] == "text_completion"
    assert not answer.must_close
    conn.close()


async def test_chunked_request_body_split_across_writes(gw):
    body = orjson.dumps(chat("a chunked request body, sent in pieces", max_tokens=3))
    parts = [body[:10], body[10:40], body[40:]]  # the second chunk's size is two hex digits ("1e")
    encoded = chunked(*parts)
    size_line = encoded.index(b"1e\r\n")
    cuts = sorted({0, 5, size_line + 1, size_line + 3, len(encoded) - 4, len(encoded) - 1, len(encoded)})
    conn = await gw.conn()
    await conn.send(raw_request("POST", "/v1/chat/completions", headers=(
        ("Content-Type", "application/json"), ("Transfer-Encoding", "chunked"))))
    for start, end in itertools.pairwise(cuts):
        await asyncio.sleep(0.01)  # separate segments: the parser sees each piece on its own
        await conn.send(encoded[start:end])
    answer = await conn.answer("POST")
    assert answer.status == 200, answer.body
    assert answer.json()["object"] == "chat.completion"
    assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200  # framing stayed in sync
    conn.close()


# -- 5: body limit ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("expect", [False, True], ids=["plain", "expect-100"])
async def test_content_length_over_the_limit_is_413_without_the_body(gw, expect):
    conn = await gw.conn()
    headers = (("Content-Type", "application/json"), ("Content-Length", str(BODY_LIMIT * 10)))
    if expect:
        headers += (("Expect", "100-continue"),)
    await conn.send(raw_request("POST", "/v1/chat/completions", headers=headers))  # the body is never sent
    answer = await conn.answer("POST")
    assert_openai_error(answer, 413, code="body_too_large")
    assert answer.interim == []  # no 100 Continue: the client is not invited to send a body that is refused
    assert await conn.closed_by_server() == b""
    await health_ok(gw.port)


async def test_chunked_body_over_the_limit_is_413(gw):
    conn = await gw.conn()
    await conn.send(raw_request("POST", "/v1/chat/completions", headers=(
        ("Content-Type", "application/json"), ("Transfer-Encoding", "chunked"))))
    try:
        for _ in range(10):
            await conn.send(b"%x\r\n%b\r\n" % (1000, b"x" * 1000))
        await conn.send(b"0\r\n\r\n")
    except ConnectionError:
        pass  # the server may answer and close before the whole body is in
    answer = await conn.answer("POST")
    assert_openai_error(answer, 413, code="body_too_large")
    assert gw.stack.recorder.done == [] and gw.inflight() == 0
    await health_ok(gw.port)


# -- 6: malformed input -------------------------------------------------------------------------------------

ARABIC_INDIC = str.maketrans("0123456789", "".join(chr(0x660 + d) for d in range(10)))
_GOOD = orjson.dumps(completion())
_POST = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"

MALFORMED = {
    "bad-request-line": b"GARBAGE\r\n\r\n",
    "header-without-colon": _POST + b"NoColonHere\r\nContent-Length: 2\r\n\r\n{}",
    "non-numeric-content-length": _POST + b"Content-Length: abc\r\n\r\n{}",
    "content-length-and-chunked": _POST + b"Content-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n"
                                          b"2\r\n{}\r\n0\r\n\r\n",
    "invalid-chunk-size": _POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "conflicting-content-lengths": _POST + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    # Content-Length is 1*DIGIT in ASCII (RFC 9110 8.6); str.isdigit() also accepts other scripts' digits
    "superscript-digit-content-length": _POST + "Content-Length: \u00b2\r\n\r\n{}".encode(),
    # a valid request body whose length is written in Arabic-Indic digits: it must not be served
    "arabic-indic-content-length": _POST + b"Content-Length: %b\r\n\r\n%b" % (
        str(len(_GOOD)).translate(ARABIC_INDIC).encode(), _GOOD),
}


@pytest.mark.parametrize("data", list(MALFORMED.values()), ids=list(MALFORMED))
async def test_malformed_request_is_400_and_closes_only_its_connection(gw, data):
    other = await gw.conn()  # opened before the bad one, used after it
    assert (await other.request(raw_request("GET", "/health"), "GET")).status == 200
    conn = await gw.conn()
    await conn.send(data)
    answer = await conn.answer("POST")
    assert_openai_error(answer, 400, type_="invalid_request_error", code="BadRequest")
    assert await conn.closed_by_server() == b""
    assert gw.stack.recorder.done == [] and gw.inflight() == 0
    good = await other.request(json_request("/v1/completions", completion()))
    assert good.status == 200 and good.json()["object"] == "text_completion"
    other.close()


async def test_oversized_head_is_400_and_closed_not_a_hang(gw):
    other = await gw.conn()
    assert (await other.request(raw_request("GET", "/health"), "GET")).status == 200
    conn = await gw.conn()
    line = b"X-Filler-%06d: " + b"v" * 1000 + b"\r\n"
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(line % i for i in range(300))
    assert len(head) > 256 * 1024
    try:
        await conn.send(head)  # no blank line: the head never ends, the server must give up on its own
    except ConnectionError:
        pass
    answer = await conn.answer("GET")
    assert_openai_error(answer, 400, type_="invalid_request_error")
    assert await conn.closed_by_server() == b""
    assert (await other.request(raw_request("GET", "/health"), "GET")).status == 200
    other.close()


async def test_pipelined_malformed_request_after_a_good_one(gw):
    conn = await gw.conn()
    await conn.send(json_request("/v1/completions", completion()) + b"GARBAGE\r\n\r\n")
    good = await conn.answer("POST")
    assert good.status == 200 and good.json()["object"] == "text_completion"
    assert_openai_error(await conn.answer("GET"), 400, type_="invalid_request_error")
    assert await conn.closed_by_server() == b""


async def test_large_header_value_is_accepted(gw):
    # long bearer tokens and trace baggage: the aiohttp front end takes header values up to 64 KiB (a route
    # that is not proxied, so the model server's own header limit plays no part)
    conn = await gw.conn()
    answer = await conn.request(raw_request("GET", "/health", headers=(("Authorization", "Bearer " + "t" * 60000),)),
                                "GET")
    assert answer.status == 200 and answer.json() == {"status": "ok"}
    assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200
    conn.close()


async def test_chunk_extensions_and_trailers_are_accepted(gw):
    body = orjson.dumps(completion("chunk extensions"))
    conn = await gw.conn()
    await conn.send(raw_request("POST", "/v1/completions", headers=(
        ("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")))
        + b"%x;name=value\r\n%b\r\n%x\r\n%b\r\n0\r\nX-Trailer: yes\r\n\r\n" % (7, body[:7], len(body) - 7,
                                                                                    body[7:]))
    answer = await conn.answer("POST")
    assert answer.status == 200 and answer.json()["object"] == "text_completion"
    assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200  # trailer fully consumed
    conn.close()


# -- 7, 8: HTTP/1.0 and Connection: close -------------------------------------------------------------------


async def test_http10_keep_alive_on_request(gw):
    conn = await gw.conn()
    keep = (("Connection", "keep-alive"),)
    first = await conn.request(json_request("/v1/completions", completion(), version="1.0", headers=keep))
    assert first.status == 200 and first.json()["object"] == "text_completion"
    assert (first.header("connection") or "").lower() == "keep-alive" and first.header("content-length")
    second = await conn.request(raw_request("GET", "/health", version="1.0", headers=keep), "GET")
    assert second.status == 200 and second.json() == {"status": "ok"}
    conn.close()


async def test_http10_expect_100_continue_is_ignored(gw):
    # RFC 9110 10.1.1: a server that receives a 100-continue expectation in an HTTP/1.0 request MUST ignore it
    body = orjson.dumps(completion())
    conn = await gw.conn()
    data = json_request("/v1/completions", completion(), version="1.0", headers=(("Expect", "100-continue"),))
    await conn.send(data[:-len(body)])
    await asyncio.sleep(0.05)
    await conn.send(body)
    answer = await conn.answer("POST", close=True)
    assert answer.status == 200 and answer.json()["object"] == "text_completion"
    assert answer.interim == [], "an HTTP/1.0 client was sent an interim 1xx response"
    assert await conn.closed_by_server() == b""




async def test_http10_request_is_answered_and_closed(gw):
    conn = await gw.conn()
    answer = await conn.request(json_request("/v1/completions", completion(), version="1.0"), close=True)
    assert answer.status == 200 and answer.json()["object"] == "text_completion"
    assert answer.header("transfer-encoding") is None
    assert await conn.closed_by_server() == b""


async def test_http10_get_without_host_is_answered_and_closed(gw):
    conn = await gw.conn()
    answer = await conn.request(b"GET /health HTTP/1.0\r\n\r\n", "GET", close=True)
    assert answer.status == 200 and answer.json() == {"status": "ok"}
    assert await conn.closed_by_server() == b""


async def test_http10_stream_is_unchunked_and_ended_by_the_close(gw):
    conn = await gw.conn()
    answer = await conn.request(json_request("/v1/completions", completion(max_tokens=8, stream=True),
                                             version="1.0"), close=True)
    assert answer.status == 200
    assert (answer.header("content-type") or "").startswith("text/event-stream")
    assert answer.header("transfer-encoding") is None and answer.header("content-length") is None
    assert not any(re.fullmatch(r"[0-9a-fA-F]+", line.strip()) for line in answer.body.decode().split("\r\n")
                   if line.strip()), answer.body[:200]
    events = answer.sse_events()
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    assert [json.loads(e[6:])["object"] for e in events[:-1]] == ["text_completion"] * (len(events) - 1)
    assert await conn.closed_by_server() == b""


@pytest.mark.parametrize("kind", ["health", "proxied", "proxied-stream"])
async def test_connection_close_is_honoured(gw, kind):
    data = {
        "health": raw_request("GET", "/health", headers=(("Connection", "close"),)),
        "proxied": json_request("/v1/completions", completion(), headers=(("Connection", "close"),)),
        "proxied-stream": json_request("/v1/completions", completion(stream=True),
                                       headers=(("Connection", "close"),)),
    }[kind]
    conn = await gw.conn()
    answer = await conn.request(data, "GET" if kind == "health" else "POST", close=True)
    assert answer.status == 200
    assert (answer.header("connection") or "").lower() == "close"
    if kind == "proxied-stream":
        assert answer.sse_events()[-1] == "data: [DONE]"
    assert await conn.closed_by_server() == b""


# -- 9: routes ----------------------------------------------------------------------------------------------


async def test_head_health_has_no_body_and_keeps_the_connection_in_sync(gw):
    conn = await gw.conn()
    head = await conn.request(raw_request("HEAD", "/health"), "HEAD")
    assert head.status == 200 and head.body == b""
    # a body sent after the HEAD answer would be parsed as the next response's start and fail here
    get = await conn.request(raw_request("GET", "/health"), "GET")
    assert get.status == 200 and get.json() == {"status": "ok"}
    assert (get.header("content-type") or "").startswith("application/json")
    conn.close()


async def test_get_routes(gw):
    conn = await gw.conn()
    models = await conn.request(raw_request("GET", "/v1/models"), "GET")
    ready = await conn.request(raw_request("GET", "/ready"), "GET")
    head_models = await conn.request(raw_request("HEAD", "/v1/models"), "HEAD")
    assert models.status == 200 and models.json()["object"] == "list"
    assert [m["id"] for m in models.json()["data"]] == [MODEL]
    assert ready.status == 200 and ready.json()["status"] == "ready"
    assert head_models.status == 200 and head_models.body == b""
    conn.close()


@pytest.mark.parametrize(("method", "target"), [
    ("GET", "/nope"), ("GET", "/v1/completions"), ("POST", "/v1/nope"), ("POST", "/health"), ("DELETE", "/ready"),
])
async def test_unknown_route_or_method_is_404_in_openai_format(gw, method, target):
    conn = await gw.conn()
    body = b"{}" if method == "POST" else None
    answer = await conn.request(raw_request(method, target, body), method)
    assert_openai_error(answer, 404, type_="not_found_error")
    assert not answer.must_close
    assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200
    conn.close()


# -- 10: keep-alive timeout ----------------------------------------------------------------------------------


@pytest.mark.parametrize("used", [True, False], ids=["after-a-response", "never-used"])
async def test_idle_connection_is_closed_after_the_keepalive_timeout(gateway, used):
    gw = await gateway(keepalive_timeout=0.3)
    conn = await gw.conn()
    if used:
        answer = await conn.request(raw_request("GET", "/health"), "GET")
        assert answer.status == 200 and not answer.must_close
    assert await conn.closed_by_server(timeout=3.0) == b""


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
async def test_request_in_flight_is_not_cut_by_the_keepalive_timer(gateway, stream):
    gw = await gateway(slow_sim(0.02), keepalive_timeout=0.3)
    conn = await gw.conn()
    started = time.monotonic()
    answer = await conn.request(json_request("/v1/completions", completion(max_tokens=40, stream=stream)))
    took = time.monotonic() - started
    assert took > 0.3, "the test needs a request that outlives the keep-alive timeout"
    assert answer.status == 200 and not answer.must_close
    if stream:
        assert answer.sse_events()[-1] == "data: [DONE]"
    else:
        assert answer.json()["usage"]["completion_tokens"] == 40
    # the idle timer starts again only now: an immediate next request is still served on this connection
    assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200
    conn.close()


# -- 11, 12, 15: request target forms, streaming, headers ----------------------------------------------------


async def test_absolute_form_target_is_served_like_origin_form(gw):
    conn = await gw.conn()
    answer = await conn.request(json_request(f"http://127.0.0.1:{gw.port}/v1/completions", completion()))
    assert answer.status == 200 and answer.json()["object"] == "text_completion"
    health = await conn.request(raw_request("GET", f"http://127.0.0.1:{gw.port}/health"), "GET")
    assert health.status == 200 and health.json() == {"status": "ok"}
    conn.close()


async def test_stream_is_chunked_event_stream_ending_with_done(gw):
    conn = await gw.conn()
    answer = await conn.request(json_request("/v1/chat/completions", chat(max_tokens=12, stream=True)))
    assert answer.status == 200
    assert (answer.header("transfer-encoding") or "").lower() == "chunked"
    assert answer.header("content-length") is None
    assert (answer.header("content-type") or "").startswith("text/event-stream")
    assert any(c.chunk_end for c in answer.chunks)  # h11 saw real chunk framing
    events = answer.sse_events()
    assert events[-1] == "data: [DONE]"
    objects = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert {o["object"] for o in objects} == {"chat.completion.chunk"}
    assert any(c.get("finish_reason") == "length" for o in objects for c in o["choices"])
    assert not answer.must_close
    assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200
    conn.close()


async def test_date_and_request_id_headers(gw):
    conn = await gw.conn()
    given = await conn.request(json_request("/v1/completions", completion(), headers=(("x-request-id", "abc-123"),)))
    minted = await conn.request(json_request("/v1/completions", completion(stream=True)))
    health = await conn.request(raw_request("GET", "/health"), "GET")
    for answer in (given, minted, health):
        date = answer.header("date")
        assert date is not None and parsedate_to_datetime(date).tzinfo is not None
    assert given.header("x-request-id") == "abc-123"
    assert minted.header("x-request-id")
    conn.close()


# -- 13, 14: client disconnect and graceful stop -------------------------------------------------------------


async def test_client_disconnect_mid_stream_frees_the_request(gateway):
    gw = await gateway(sim(time_scale=0.05))
    conn = await gw.conn()
    await conn.send(json_request("/v1/chat/completions", chat(max_tokens=5000, stream=True)))
    conn.shadow("POST")
    response = await conn.event()
    assert isinstance(response, h11.Response) and response.status_code == 200
    assert isinstance(await conn.event(), h11.Data)
    assert gw.inflight() == 1 and gw.sim.engine.num_running == 1
    conn.abort()  # the client goes away mid-stream
    await eventually(lambda: gw.inflight() == 0, timeout=5, what="in-flight count released")
    await eventually(lambda: gw.sim.engine.num_running == 0, timeout=5, what="the upstream request aborted")
    assert gw.stack.recorder.infos[-1].status == 499
    fresh = await gw.conn()
    answer = await fresh.request(json_request("/v1/completions", completion()))
    assert answer.status == 200 and answer.json()["object"] == "text_completion"
    fresh.close()


async def test_graceful_stop_lets_a_stream_finish_and_refuses_new_connections(gateway):
    gw = await gateway(slow_sim(0.02), shutdown_timeout=5.0)
    conn = await gw.conn()
    await conn.send(json_request("/v1/completions", completion(max_tokens=30, stream=True)))
    conn.shadow("POST")
    response = await conn.event()
    assert isinstance(response, h11.Response) and response.status_code == 200
    first = await conn.event()
    assert isinstance(first, h11.Data)

    stopping = asyncio.create_task(gw.stop())
    await asyncio.sleep(0.05)
    assert not stopping.done(), "stop() returned while a stream was still in flight"
    refused_or_closed = False
    try:
        late = await asyncio.wait_for(Conn.open(gw.port), 1.0)
    except OSError:
        refused_or_closed = True
    else:
        try:
            await late.send(raw_request("GET", "/health"))
            data = await asyncio.wait_for(late.reader.read(), 2.0)
            refused_or_closed = not data.startswith(b"HTTP/1.1 200")
        except ConnectionError:
            refused_or_closed = True
        late.abort()
    assert refused_or_closed, "a connection opened after stop() began was served"

    body = bytearray(first.data)
    while True:
        ev = await conn.event()
        if isinstance(ev, h11.EndOfMessage):
            break
        assert isinstance(ev, h11.Data), ev
        body += ev.data
    events = [e for e in body.decode().split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    assert len(events) > 2 and {json.loads(e[6:])["object"] for e in events[:-1]} == {"text_completion"}
    await asyncio.wait_for(stopping, 5.0)
    assert gw.stack.recorder.infos[-1].status == 200 and gw.inflight() == 0


async def test_stop_closes_idle_keepalive_connections_promptly(gateway):
    gw = await gateway(shutdown_timeout=5.0)
    conn = await gw.conn()
    answer = await conn.request(raw_request("GET", "/health"), "GET")
    assert answer.status == 200 and not answer.must_close
    await asyncio.wait_for(gw.stop(), 2.0)  # an idle connection is not a request to wait for
    assert await conn.closed_by_server() == b""


async def test_upstream_204_is_relayed_without_a_body_and_the_connection_stays_usable(stack, transport):
    """Runs on both front ends (the ``stack`` fixture's): a 204 answer carries no Content-Length and no body
    (RFC 9110 §8.6), so the client can send its next request on the same connection."""
    async with RawServer(b"HTTP/1.1 204 No Content\r\n\r\n") as ep:
        st = await stack(random_config(), [ep.spec])
        conn = await Conn.open(st.server.port)
        try:
            first = await conn.request(json_request("/v1/completions", completion()))
            assert first.status == 204 and first.body == b"" and first.header("content-length") is None
            assert not first.must_close
            second = await conn.request(raw_request("GET", "/health"), "GET")
            assert second.status == 200 and second.json() == {"status": "ok"}
        finally:
            conn.close()
    assert [info.status for info in st.recorder.infos] == [204]
