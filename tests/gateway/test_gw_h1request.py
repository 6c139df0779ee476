"""The gateway server's request parser (``epp.http1.request``, llhttp through httptools): bodies split anywhere
decode the same, the head's framing and connection rules, the size bounds, ``Upgrade`` ignored, and what the
parser holds for requests not yet taken."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.errors import BadRequest, EppError, NotImplementedByEpp, PayloadTooLarge
from epp.http1.request import Request, RequestParser

_NEXT = b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n"


def parse_one(head: bytes, body_limit: int = 100, max_head: int = 4096) -> Request:
    """The request of ``head`` (a head without its final blank line, and no body)."""
    parser = RequestParser(body_limit, max_head)
    parser.feed(head + b"\r\n\r\n")
    req = parser.take() or parser.current
    assert req is not None, "the head did not complete"
    return req


def feed_split(parser: RequestParser, wire: bytes, cuts: list[int]) -> list[Request]:
    """Feed ``wire`` cut at ``cuts``; the complete requests, in order."""
    points = sorted({c % (len(wire) + 1) for c in cuts} | {0, len(wire)})
    taken = []
    for start, end in itertools.pairwise(points):
        parser.feed(wire[start:end])
        while (req := parser.take()) is not None:
            taken.append(req)
    return taken


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), max_size=8), st.lists(st.integers(0, 10_000), max_size=12),
       st.booleans(), st.booleans())
def test_chunked_body_split_anywhere(chunks: list[bytes], cuts: list[int], extension: bool, trailer: bool) -> None:
    ext = b";name=value" if extension else b""
    wire = b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire += b"".join(b"%x%b\r\n%b\r\n" % (len(c), ext, c) for c in chunks) + b"0\r\n"
    wire += (b"X-Trailer: 1\r\n" if trailer else b"") + b"\r\n" + _NEXT
    parser = RequestParser(1 << 20, 4096)
    first, second = feed_split(parser, wire, cuts)
    assert first.body == b"".join(chunks) and first.path == "/a"
    assert second.path == "/next" and second.body == b""
    assert parser.held == 0 and parser.current is None and not parser.in_head


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=300), st.lists(st.integers(0, 1000), max_size=8))
def test_fixed_body_split_anywhere(payload: bytes, cuts: list[int]) -> None:
    wire = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b%b" % (len(payload), payload, _NEXT)
    first, second = feed_split(RequestParser(1 << 20, 4096), wire, cuts)
    assert first.body == payload and second.path == "/next"


def test_chunked_body_limits_and_garbage() -> None:
    head = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    with pytest.raises(PayloadTooLarge):
        RequestParser(10, 4096).feed(head + b"b\r\n" + b"x" * 11 + b"\r\n")
    for bad in (b"zz\r\n", b"-1\r\n", b"0x10\r\n", b"3\r\nabcXY", b"3 \r\nabc\r\n", b"3;a\x01\r\nabc\r\n",
                b"3;a\nabc\r\n0\r\n\r\n", b"1" * 30 + b"\r\n"):
        with pytest.raises(BadRequest):
            RequestParser(100, 4096).feed(head + bad)


def test_a_failed_parser_takes_nothing_more() -> None:
    parser = RequestParser(100, 4096)
    with pytest.raises(BadRequest):
        parser.feed(b"GARBAGE\r\n\r\n")
    with pytest.raises(BadRequest):
        parser.feed(_NEXT)
    assert parser.take() is None


def test_head_framing_and_connection_rules() -> None:
    req = parse_one(b"POST http://gw:8080/v1/chat%2Dx/completions?a=1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 12\r\n"
                    b"X-Name:  v a l  ")
    assert (req.method, req.raw_path, req.path) == ("POST", "/v1/chat%2Dx/completions?a=1", "/v1/chat-x/completions")
    assert req.keep_alive and req.headers["x-name"] == "v a l" and req.headers["content-length"] == "12"
    assert not parse_one(b"GET / HTTP/1.0").keep_alive
    assert parse_one(b"GET / HTTP/1.0\r\nConnection: keep-alive").keep_alive
    assert not parse_one(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close").keep_alive
    assert parse_one(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3").expect
    assert not parse_one(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 0").expect
    assert not parse_one(b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3").expect
    assert parse_one(b"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nX-A: 2").headers["x-a"] == "2"
    with pytest.raises(PayloadTooLarge):
        parse_one(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 101")
    for bad in (b"GET /", b"GET / HTTP/2.0\r\nHost: x", b"GET / HTTP/0.9", b"get / HTTP/1.1\r\nHost: x",
                b"GET nope HTTP/1.1\r\nHost: x", b"GET / HTTP/1.1\r\nHost: x\r\nNo colon",
                b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: x", b"GET / HTTP/1.1", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b",
                b"GET / HTTP/1.0\r\nHost: a\r\nHost: b",
                b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1",
                b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked",
                b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip",
                b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked"):
        with pytest.raises(BadRequest):
            parse_one(bad)
    with pytest.raises(NotImplementedByEpp):
        parse_one(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked")


def test_head_size_is_bounded_however_it_arrives() -> None:
    for head in (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-A: 1234567890\r\n" * 300 + b"\r\n",
                 b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 5000 + b"\r\n\r\n"):
        for piece in (len(head), 64, 1):  # in one read, in pieces, a byte at a time
            parser = RequestParser(100, 4096)
            with pytest.raises(BadRequest, match="larger than 4096"):
                for i in range(0, len(head), piece):
                    parser.feed(head[i:i + piece])
    ok = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 4000 + b"\r\n\r\n"
    parser = RequestParser(100, 4096)
    for i in range(0, len(ok), 7):
        parser.feed(ok[i:i + 7])
    req = parser.take()
    assert req is not None and len(req.headers["x-big"]) == 4000


def test_trailer_section_and_blank_lines_are_bounded() -> None:
    parser = RequestParser(100, 4096)
    parser.feed(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n")
    with pytest.raises(BadRequest, match="larger than 4096"):
        for _ in range(100):
            parser.feed(b"X-T: " + b"t" * 100 + b"\r\n")
    parser = RequestParser(100, 4096)
    with pytest.raises(BadRequest, match="larger than 4096"):
        for _ in range(3000):
            parser.feed(b"\r\n")  # empty lines before a request line are allowed, but not without end


def test_upgrade_is_ignored_and_a_body_after_it_stays_a_body() -> None:
    parser = RequestParser(100, 4096)
    parser.feed(b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n" + _NEXT)
    assert [r.path for r in (parser.take(), parser.take())] == ["/a", "/next"]  # type: ignore[union-attr]
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    for framing, body in ((b"Content-Length: %d" % len(smuggled), smuggled),
                          (b"Transfer-Encoding: chunked", b"%x\r\n%b\r\n0\r\n\r\n" % (len(smuggled), smuggled))):
        wire = b"POST /a HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: x\r\n%b\r\n\r\n%b%b" % (
            framing, body, _NEXT)
        for piece in (len(wire), 5):
            parser = RequestParser(100, 4096)
            taken = feed_split(parser, wire, list(range(0, len(wire), piece)))
            assert [(r.path, r.body) for r in taken] == [("/a", smuggled), ("/next", b"")]


def test_held_bytes_count_requests_not_taken() -> None:
    parser = RequestParser(1 << 20, 4096)
    parser.feed((b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000) * 3 +
                b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
    assert len(parser.ready) == 3 and parser.current is not None and parser.current.size == 10
    held = parser.held
    assert held > 3 * 1000 + 10
    parser.take()
    assert held - parser.held > 1000
    while parser.take() is not None:
        pass
    parser.feed(b"x" * 990)
    assert parser.take() is not None and parser.held == 0


def test_discard_drops_every_held_request() -> None:
    """After a refusal the connection discards what the parser holds: complete and unfinished requests alike."""
    parser = RequestParser(1 << 20, 4096)
    parser.feed(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n" + b"x" * 10 +
                b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 500 + b"GET /n")
    assert parser.ready and parser.current is not None and parser.held > 500
    parser.discard()
    assert parser.take() is None and parser.current is None and not parser.in_head and parser.held == 0


def test_error_path_picks_the_envelope() -> None:
    parser = RequestParser(100, 4096)
    with pytest.raises(EppError):
        parser.feed(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n")
    assert parser.error_path() == "/v1/messages"
    parser = RequestParser(100, 4096)
    with pytest.raises(PayloadTooLarge):
        parser.feed(b"POST /v1/messages?beta=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n")
    assert parser.error_path() == "/v1/messages" and parser.current is not None
    parser = RequestParser(100, 4096)
    with pytest.raises(BadRequest):
        parser.feed(b"GARBAGE\r\n\r\n")
    assert parser.error_path() == ""
