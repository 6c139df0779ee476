"""Request smuggling and framing attacks on the lean front end, over real sockets to a real server.

Each case sends raw bytes, most followed by a *smuggled* request (a completion with ``x-request-id: smuggled``)
that a server framing the first request differently from llhttp would execute. The table gives the statuses the
connection must answer, in order; after an error the connection must close with nothing more, after success a
``GET /health`` on the same connection must still be answered (the framing stayed in sync). The smuggled request
must never reach the proxy.

The differential tests hold the server to llhttp (``httptools`` used directly, with its strict defaults): for a
corpus of requests, whether the request is refused and where its body ends agree, except where EPP's own rules
(:mod:`epp.http1.request`: versions, ``Host``, transfer codings, target forms) refuse what llhttp accepts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import httptools
import orjson
import pytest

from epp.errors import EppError
from epp.http1.request import RequestParser

from .test_gw_http1_server import Conn, Gw, completion, gateway, raw_request  # noqa: F401 (the fixture)

_BODY = orjson.dumps(completion())
_P11 = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
_SMUGGLED = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-request-id: smuggled\r\nContent-Type: application/json"
             b"\r\nContent-Length: %d\r\n\r\n%b" % (len(_BODY), _BODY))
_CL = b"Content-Length: %d\r\n" % len(_BODY)
_TE = b"Transfer-Encoding: chunked\r\n"


def _chunked(body: bytes = _BODY, ext: bytes = b"", trailer: bytes = b"") -> bytes:
    """``body`` as two chunks (``ext`` after each size) and the last chunk, with ``trailer`` lines."""
    half = len(body) // 2
    return (b"%x%b\r\n%b\r\n%x%b\r\n%b\r\n0\r\n%b\r\n" % (half, ext, body[:half], len(body) - half, ext, body[half:],
                                                           trailer))


def _hdr(extra: bytes) -> bytes:
    """A GET /health head with ``extra`` header bytes, then the smuggled request."""
    return b"GET /health HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n" + _SMUGGLED


# (id, bytes, statuses answered in order)
CASES: list[tuple[str, bytes, list[int]]] = [
    # Content-Length and Transfer-Encoding together, repeated or malformed lengths
    ("cl-then-te", _P11 + _CL + _TE + b"\r\n" + _chunked() + _SMUGGLED, [400]),
    ("te-then-cl", _P11 + _TE + _CL + b"\r\n" + _chunked() + _SMUGGLED, [400]),
    ("cl-te-smuggle-in-body", _P11 + b"Content-Length: 4\r\n" + _TE + b"\r\n0\r\n\r\n" + _SMUGGLED, [400]),
    ("duplicate-cl-equal", _P11 + _CL + _CL + b"\r\n" + _BODY + _SMUGGLED, [400]),
    ("differing-cl", _P11 + _CL + b"Content-Length: 0\r\n\r\n" + _BODY + _SMUGGLED, [400]),
    ("cl-list", _P11 + b"Content-Length: %d, %d\r\n\r\n" % (len(_BODY), len(_BODY)) + _BODY + _SMUGGLED, [400]),
    ("cl-plus-sign", _P11 + b"Content-Length: +%d\r\n\r\n" % len(_BODY) + _BODY + _SMUGGLED, [400]),
    ("cl-negative", _P11 + b"Content-Length: -1\r\n\r\n" + _SMUGGLED, [400]),
    ("cl-hex", _P11 + b"Content-Length: 0x10\r\n\r\n" + _BODY + _SMUGGLED, [400]),
    ("cl-space-inside", _P11 + b"Content-Length: 1 0\r\n\r\n" + _BODY + _SMUGGLED, [400]),
    ("cl-overflow", _P11 + b"Content-Length: 99999999999999999999999\r\n\r\n" + _SMUGGLED, [400]),
    ("cl-over-limit", _P11 + b"Content-Length: 99999999\r\n\r\n" + _SMUGGLED, [413]),
    # line folding, bare CR and bare LF in the head
    ("obs-fold", _hdr(b"X-A: a\r\n b\r\n"), [400]),
    ("obs-fold-te", _P11 + b"Transfer-Encoding:\r\n chunked\r\n\r\n" + _chunked() + _SMUGGLED, [400]),
    ("bare-cr-in-value", _hdr(b"X-A: a\rb\r\n"), [400]),
    ("bare-cr-line-end", _hdr(b"X-A: a\rX-B: b\r\n"), [400]),
    ("bare-lf-line-end", b"GET /health HTTP/1.1\r\nHost: x\nX-A: a\r\n\r\n" + _SMUGGLED, [400]),
    ("bare-lf-request-line", b"GET /health HTTP/1.1\nHost: x\r\n\r\n" + _SMUGGLED, [400]),
    ("bare-lf-end-of-head", b"GET /health HTTP/1.1\r\nHost: x\r\n\n" + _SMUGGLED, [400]),
    ("lf-in-value", _hdr(b"X-A: a\nb\r\n"), [400]),
    # chunk lines
    ("bare-lf-after-chunk-size", _P11 + _TE + b"\r\n%x\n%b\r\n0\r\n\r\n" % (len(_BODY), _BODY) + _SMUGGLED, [400]),
    ("bare-lf-after-chunk-ext", _P11 + _TE + b"\r\n%x;a=b\n%b\r\n0\r\n\r\n" % (len(_BODY), _BODY) + _SMUGGLED,
     [400]),
    ("bare-lf-after-chunk-data", _P11 + _TE + b"\r\n%x\r\n%b\n0\r\n\r\n" % (len(_BODY), _BODY) + _SMUGGLED, [400]),
    ("chunk-data-longer-than-size", _P11 + _TE + b"\r\n2\r\n{}XX\r\n0\r\n\r\n" + _SMUGGLED, [400]),
    ("chunk-size-overflow", _P11 + _TE + b"\r\nffffffffffffffffffff\r\n{}\r\n0\r\n\r\n" + _SMUGGLED, [400]),
    ("chunk-size-invalid-hex", _P11 + _TE + b"\r\nzz\r\n{}\r\n0\r\n\r\n" + _SMUGGLED, [400]),
    ("chunk-size-0x-prefix", _P11 + _TE + b"\r\n0x2\r\n{}\r\n0\r\n\r\n" + _SMUGGLED, [400]),
    ("chunk-size-negative", _P11 + _TE + b"\r\n-2\r\n{}\r\n0\r\n\r\n" + _SMUGGLED, [400]),
    ("chunk-size-space-before-ext", _P11 + _TE + b"\r\n" + _chunked(ext=b" ;a=b") + _SMUGGLED, [400]),
    ("chunk-size-trailing-space", _P11 + _TE + b"\r\n" + _chunked(ext=b" ") + _SMUGGLED, [400]),
    ("chunk-ext-control-char", _P11 + _TE + b"\r\n" + _chunked(ext=b";a\x01") + _SMUGGLED, [400]),
    ("chunk-ext-nul", _P11 + _TE + b"\r\n" + _chunked(ext=b";a=\x00") + _SMUGGLED, [400]),
    ("chunk-ext-bare-cr", _P11 + _TE + b"\r\n" + _chunked(ext=b";a\rb") + _SMUGGLED, [400]),
    ("chunk-ext-valid", _P11 + _TE + b"\r\n" + _chunked(ext=b';a=b;c="d e"'), [200]),
    ("last-chunk-missing", _P11 + _TE + b"\r\n%x\r\n%b\r\n\r\n" % (len(_BODY), _BODY) + _SMUGGLED, [400]),
    # trailers
    ("trailer-valid", _P11 + _TE + b"\r\n" + _chunked(trailer=b"X-T: 1\r\n"), [200]),
    ("trailer-bare-lf-swallows-next-head", _P11 + _TE + b"\r\n" + _chunked(trailer=b"X-T: 1\n") + _SMUGGLED, [400]),
    ("trailer-bare-lf-end", _P11 + _TE + b"\r\n%x\r\n%b\r\n0\r\n\n" % (len(_BODY), _BODY) + _SMUGGLED, [400]),
    ("trailer-non-token-name", _P11 + _TE + b"\r\n" + _chunked(trailer=b"X T: 1\r\n") + _SMUGGLED, [400]),
    ("trailer-obs-fold", _P11 + _TE + b"\r\n" + _chunked(trailer=b"X-T: 1\r\n 2\r\n") + _SMUGGLED, [400]),
    ("trailer-control-char", _P11 + _TE + b"\r\n" + _chunked(trailer=b"X-T: \x01\r\n") + _SMUGGLED, [400]),
    ("trailer-content-length", _P11 + _TE + b"\r\n" + _chunked(trailer=b"Content-Length: 5\r\n") + _SMUGGLED, [400]),
    # header names and values
    ("name-with-space", _hdr(b"X A: a\r\n"), [400]),
    ("space-before-colon", _hdr(b"X-A : a\r\n"), [400]),
    ("name-with-paren", _hdr(b"X(A): a\r\n"), [400]),
    ("name-with-nul", _hdr(b"X\x00A: a\r\n"), [400]),
    ("name-non-ascii", _hdr(b"X\xffA: a\r\n"), [400]),
    ("empty-name", _hdr(b": a\r\n"), [400]),
    ("no-colon", _hdr(b"X-A a\r\n"), [400]),
    ("space-before-te-colon", _P11 + b"Transfer-Encoding : chunked\r\n" + _CL + b"\r\n" + _BODY + _SMUGGLED, [400]),
    ("value-nul", _hdr(b"X-A: a\x00b\r\n"), [400]),
    ("value-control-char", _hdr(b"X-A: a\x01b\r\n"), [400]),
    ("value-escape", _hdr(b"X-A: a\x1bb\r\n"), [400]),
    ("value-del", _hdr(b"X-A: a\x7fb\r\n"), [400]),
    ("value-tab-ok", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\tb\r\n\r\n", [200]),
    ("value-obs-text-ok", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: caf\xc3\xa9\r\n\r\n", [200]),
    # request line
    ("lower-case-method", b"get /health HTTP/1.1\r\nHost: x\r\n\r\n" + _SMUGGLED, [400]),
    ("unknown-method", b"FOO /health HTTP/1.1\r\nHost: x\r\n\r\n" + _SMUGGLED, [400]),
    ("tab-separator", b"GET\t/health HTTP/1.1\r\nHost: x\r\n\r\n" + _SMUGGLED, [400]),
    ("space-in-target", b"GET /hea lth HTTP/1.1\r\nHost: x\r\n\r\n" + _SMUGGLED, [400]),
    ("nul-in-target", b"GET /hea\x00lth HTTP/1.1\r\nHost: x\r\n\r\n" + _SMUGGLED, [400]),
    ("http-0.9-line", b"GET /health\r\n" + _SMUGGLED, [400]),
    ("http-1.2", b"GET /health HTTP/1.2\r\nHost: x\r\n\r\n" + _SMUGGLED, [400]),
    ("http-2.0", b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n" + _SMUGGLED, [400]),
    ("asterisk-form", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n" + _SMUGGLED, [400]),
    ("authority-form-connect", b"CONNECT x:443 HTTP/1.1\r\nHost: x\r\n\r\n" + _SMUGGLED, [400]),
    ("leading-empty-lines-ok", b"\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n", [200]),
    # Host
    ("no-host", b"GET /health HTTP/1.1\r\n\r\n" + _SMUGGLED, [400]),
    ("two-hosts", b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n" + _SMUGGLED, [400]),
    # transfer codings
    ("te-gzip", _P11 + b"Transfer-Encoding: gzip\r\n\r\n" + _SMUGGLED, [400]),
    ("te-identity", _P11 + b"Transfer-Encoding: identity\r\n" + _CL + b"\r\n" + _BODY + _SMUGGLED, [400]),
    ("te-gzip-chunked", _P11 + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + _chunked() + _SMUGGLED, [501]),
    ("te-chunked-gzip", _P11 + b"Transfer-Encoding: chunked, gzip\r\n\r\n" + _chunked() + _SMUGGLED, [400]),
    ("te-chunked-twice", _P11 + b"Transfer-Encoding: chunked, chunked\r\n\r\n" + _chunked() + _SMUGGLED, [400]),
    ("te-two-lines", _P11 + _TE + _TE + b"\r\n" + _chunked() + _SMUGGLED, [400]),
    ("te-xchunked", _P11 + b"Transfer-Encoding: xchunked\r\n\r\n" + _chunked() + _SMUGGLED, [400]),
    ("te-chunked-upper-ok", _P11 + b"Transfer-Encoding: CHUNKED\r\n\r\n" + _chunked(), [200]),
    ("te-in-http-1.0", b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n" + _TE + b"\r\n"
     + _chunked() + _SMUGGLED, [400]),
    ("te-and-cl-in-http-1.0", b"POST /v1/completions HTTP/1.0\r\n" + _TE + _CL + b"\r\n" + _BODY + _SMUGGLED, [400]),
    # oversized input, pipelining after a bad request, Upgrade
    ("oversized-head", _hdr(b"".join(b"X-F%05d: %b\r\n" % (i, b"v" * 1000) for i in range(200))), [400]),
    ("oversized-trailer", _P11 + _TE + b"\r\n" + _chunked(trailer=b"X-T: " + b"t" * 200_000 + b"\r\n") + _SMUGGLED,
     [400]),
    ("pipelined-after-garbage", b"GARBAGE\r\n\r\n" + _SMUGGLED, [400]),
    ("pipelined-after-bad-header", _hdr(b"Bad Name: 1\r\n"), [400]),
    ("good-then-bad-then-smuggled", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE\r\n\r\n" + _SMUGGLED, [200, 400]),
    ("upgrade-body-is-a-body", b"POST /nope HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c\r\n"
     b"Content-Length: %d\r\n\r\n%b" % (len(_SMUGGLED), _SMUGGLED), [404]),
    ("upgrade-chunked-body-is-a-body", b"POST /nope HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c\r\n"
     + _TE + b"\r\n" + _chunked(_SMUGGLED), [404]),
    ("upgrade-get-then-next", (b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                               b"\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n"), [200, 200]),
]


@pytest.fixture
async def gw(gateway) -> Gw:
    return await gateway(body_limit=LIMIT)


def _smuggled_ran(gw: Gw) -> bool:
    return any(request.request_id == "smuggled" for request, _, _ in gw.stack.recorder.done)


async def _answers(conn: Conn, data: bytes, count: int) -> list[int]:
    """Send ``data`` and read ``count`` answers (their statuses; GET is assumed unless the request was a POST to an
    inference path, which only decides how h11 reads the answer's framing: both have bodies)."""
    try:
        await conn.send(data)
    except ConnectionError:
        pass  # the server may answer and close before all is in
    return [(await conn.answer("GET")).status for _ in range(count)]


@pytest.mark.parametrize(("data", "statuses"), [(d, s) for _, d, s in CASES], ids=[c[0] for c in CASES])
async def test_smuggling_case(gw, data, statuses):
    conn = await gw.conn()
    assert await _answers(conn, data, len(statuses)) == statuses
    if statuses[-1] >= 400 and statuses[-1] != 404:
        assert await conn.closed_by_server() == b"", "more was answered after the error"
    else:
        assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200
        conn.close()
    assert not _smuggled_ran(gw)
    assert gw.inflight() == 0


# -- differential: the server against llhttp ------------------------------------------------------------------


@dataclass
class Message:
    """One request as llhttp read it (``version`` is set once its head is complete)."""

    url: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    version: str | None = None
    method: bytes = b""
    keep_alive: bool = True
    complete: bool = False


class Reference:
    """What llhttp (``httptools`` with its defaults) makes of a byte stream: its messages, and whether it failed."""

    def __init__(self, data: bytes) -> None:
        self.messages: list[Message] = []
        self.error = self.upgrade = False
        self.parser = httptools.HttpRequestParser(self)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.upgrade = True
        except httptools.HttpParserError:
            self.error = True

    def on_message_begin(self) -> None:
        self.messages.append(Message())

    def on_url(self, url: bytes) -> None:
        self.messages[-1].url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.messages[-1].version is None:  # (trailer fields come after the head)
            self.messages[-1].headers.append((name.lower(), value.strip(b" \t")))

    def on_headers_complete(self) -> None:
        message = self.messages[-1]
        message.version = self.parser.get_http_version()
        message.method = self.parser.get_method()
        message.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.messages[-1].body += body

    def on_message_complete(self) -> None:
        self.messages[-1].complete = True


LIMIT = 1 << 20
"""The body limit of both the parser and the server under test."""


def epp_refuses(message: Message) -> bool:
    """Whether EPP's rules on top of llhttp refuse a message whose head llhttp accepted (see
    :mod:`epp.http1.request`; the body limit included)."""
    hosts = sum(name == b"host" for name, _ in message.headers)
    codings = [value for name, value in message.headers if name == b"transfer-encoding"]
    length = int(dict(message.headers).get(b"content-length") or 0)
    return (message.version not in ("1.0", "1.1") or hosts > 1 or (message.version == "1.1" and hosts == 0)
            or bool(codings and (message.version == "1.0" or b", ".join(codings).lower() != b"chunked"))
            or not message.url.startswith((b"/", b"http://", b"https://"))
            or length > LIMIT or len(message.body) > LIMIT)


def expected(ref: Reference, *, connection: bool = False) -> tuple[list[tuple[bytes, bytes]], bool]:
    """(method and body of each message EPP serves, whether it then refuses) by llhttp's reading and EPP's rules:
    a message is refused once its head is complete, served once its body is. With ``connection``, as a connection
    serves them: none after one that does not keep the connection alive."""
    served: list[tuple[bytes, bytes]] = []
    for message in ref.messages:
        if message.version is None:
            break
        if epp_refuses(message):
            return served, True
        if not message.complete:
            break
        served.append((message.method, message.body))
        if connection and not message.keep_alive:
            return served, False
    return served, ref.error


_SEEDS = [
    _P11 + _CL + b"\r\n" + _BODY,
    _P11 + _TE + b"\r\n" + _chunked(),
    _P11 + _TE + b"\r\n" + _chunked(ext=b";a=b", trailer=b"X-T: 1\r\n"),
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: b\r\n\r\n",
    b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n" + _CL + b"\r\n" + _BODY,
]
_ALPHABET = [b"\r", b"\n", b"\r\n", b"\x00", b" ", b"\t", b":", b";", b",", b"0", b"1", b"f", b"x", b"-", b"+",
             b'"', b"\x7f", b"\x01", b"\xff", b"Content-Length: 1\r\n", b"Transfer-Encoding: chunked\r\n",
             b"Host: y\r\n", b"\r\n\r\n", b" chunked", b"HTTP/1.0"]


def mutants(count: int, seed: int, seeds: list[bytes] = _SEEDS) -> list[bytes]:
    """``count`` requests: a seed request with one to three random insertions, replacements or deletions of
    framing-relevant bytes, followed by a valid request (so that a misread end of body shows)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(data))
            op = rng.randrange(3)
            if op == 0:
                data[pos:pos] = rng.choice(_ALPHABET)
            elif op == 1:
                data[pos:pos + 1] = rng.choice(_ALPHABET)
            else:
                del data[pos]
        out.append(bytes(data) + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    return out


def _corpus() -> list[bytes]:
    return [data for _, data, _ in CASES] + _SEEDS + mutants(4000, seed=30)


def test_parser_agrees_with_llhttp_on_a_fuzzed_corpus() -> None:
    """EPP's parser, fed each input in one piece and in 7-byte pieces, serves exactly the messages llhttp reads
    (method and body) until llhttp fails or EPP's rules refuse one, and refuses exactly then."""
    compared = 0
    for data in _corpus():
        ref = Reference(data)
        if ref.upgrade:
            continue  # llhttp hands the rest to another protocol; EPP ignores Upgrade (the cases above)
        want = expected(ref)
        for piece in (len(data), 7):
            parser = RequestParser(LIMIT, 1 << 20)
            served, refused = [], False
            try:
                for i in range(0, len(data), piece):
                    parser.feed(data[i:i + piece])
                    while (req := parser.take()) is not None:
                        served.append((req.method.encode(), req.body))
            except EppError:
                refused = True
                while (req := parser.take()) is not None:
                    served.append((req.method.encode(), req.body))
            assert (served, refused) == want, data
        compared += 1
    assert compared > 3500  # few inputs are upgrades


async def test_server_agrees_with_llhttp_over_sockets(gw):
    """Over real sockets: for each input the server answers as many requests as llhttp reads (before a refusal),
    refuses when llhttp fails or EPP's rules refuse, and each served request ended where llhttp ended it (the
    request after it is answered; a completion's JSON body arrived whole). The mutants go to a path that answers
    404 whatever the body (a mutated body is the parser test's to compare)."""
    small = [data for _, data, _ in CASES if len(data) < 64 * 1024]  # (the head limit is EPP's, not llhttp's)
    for data in small + mutants(150, seed=31, seeds=[s.replace(b"/v1/completions", b"/nope") for s in _SEEDS]):
        ref = Reference(data)
        if ref.upgrade:
            continue
        served, refused = expected(ref, connection=True)
        closes = refused or (bool(served) and not ref.messages[len(served) - 1].keep_alive)
        conn = await gw.conn()
        statuses = await _answers(conn, data, len(served) + refused)
        for message, status in zip(ref.messages[:len(served)], statuses):
            if message.url == b"/v1/completions" and message.body == _BODY:
                assert status == 200, (data, statuses)  # the JSON body arrived whole
        if refused:
            assert statuses[-1] in (400, 413, 501), (data, statuses)
        else:
            assert all(s not in (400, 413, 501) for s in statuses), (data, statuses)
        if closes:
            assert await conn.closed_by_server() == b"", data
        else:
            assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200, data
            conn.close()
    assert not _smuggled_ran(gw)
