"""The gateway server's request parsing (``epp.gateway._h1request``): bodies split anywhere decode the same, and
the head's framing and connection rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.errors import BadRequest, PayloadTooLarge
from epp.gateway._h1request import ChunkedBody, FixedBody, parse_head


def _feed_split(reader: ChunkedBody | FixedBody, wire: bytes, cuts: list[int]) -> tuple[bytes, bytes]:
    """Feed ``wire`` cut at ``cuts`` the way the server does (unconsumed bytes are prepended to the next read);
    returns (body, bytes after the body)."""
    pending = b""
    points = sorted({c % (len(wire) + 1) for c in cuts} | {len(wire)})
    start = 0
    for point in points:
        done, rest = reader.feed(pending + wire[start:point])
        start = point
        if done:
            return reader.body(), rest + wire[start:]
        pending = rest
    raise AssertionError("body never completed")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), max_size=8), st.lists(st.integers(0, 10_000), max_size=12),
       st.booleans(), st.booleans(), st.binary(max_size=20))
def test_chunked_body_split_anywhere(chunks: list[bytes], cuts: list[int], extension: bool, trailer: bool,
                                     after: bytes) -> None:
    ext = b";name=value" if extension else b""
    wire = b"".join(b"%x%b\r\n%b\r\n" % (len(c), ext, c) for c in chunks) + b"0\r\n"
    wire += (b"X-Trailer: 1\r\n" if trailer else b"") + b"\r\n" + after
    body, rest = _feed_split(ChunkedBody(limit=1 << 20), wire, cuts)
    assert body == b"".join(chunks)
    assert rest == after


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=300), st.lists(st.integers(0, 1000), max_size=8), st.binary(max_size=20))
def test_fixed_body_split_anywhere(payload: bytes, cuts: list[int], after: bytes) -> None:
    body, rest = _feed_split(FixedBody(len(payload)), payload + after, cuts)
    assert body == payload and rest == after


def test_chunked_body_limits_and_garbage() -> None:
    with pytest.raises(PayloadTooLarge):
        ChunkedBody(limit=10).feed(b"b\r\n" + b"x" * 11 + b"\r\n")
    for bad in (b"zz\r\n", b"-1\r\n", b"0x10\r\n", b"3\r\nabcXY"):
        with pytest.raises(BadRequest):
            ChunkedBody(limit=100).feed(bad)
    with pytest.raises(BadRequest):  # a size line that never ends
        ChunkedBody(limit=100).feed(b"1" * 5000)


def test_head_framing_and_connection_rules() -> None:
    req = parse_head(b"POST http://gw:8080/v1/chat%2Dx/completions?a=1 HTTP/1.1\r\nContent-Length: 12\r\n"
                     b"X-Name:  v a l  ", 100)
    assert (req.method, req.raw_path, req.path) == ("POST", "/v1/chat%2Dx/completions?a=1", "/v1/chat-x/completions")
    assert req.keep_alive and isinstance(req.reader, FixedBody) and req.headers["x-name"] == "v a l"
    assert not parse_head(b"GET / HTTP/1.0", 100).keep_alive
    assert parse_head(b"GET / HTTP/1.0\r\nConnection: keep-alive", 100).keep_alive
    assert not parse_head(b"GET / HTTP/1.1\r\nConnection: close", 100).keep_alive
    assert parse_head(b"POST / HTTP/1.1\r\nContent-Length: 0", 100).reader is None
    assert parse_head(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3", 100).expect
    assert not parse_head(b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3", 100).expect
    with pytest.raises(PayloadTooLarge):
        parse_head(b"POST / HTTP/1.1\r\nContent-Length: 101", 100)
    for bad in (b"GET /", b"GET / HTTP/2.0", b"get / HTTP/1.1", b"GET nope HTTP/1.1", b"GET / HTTP/1.1\r\nNo colon",
                b"GET / HTTP/1.1\r\nBad Name: x", b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2",
                b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked",
                b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked"):
        with pytest.raises(BadRequest):
            parse_head(bad, 100)
