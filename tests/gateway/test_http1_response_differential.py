"""epp.http1.response against httptools used directly: for a curated corpus of responses and a seeded random fuzz,
the layer's accept/reject decision, status, headers, body and framing agree with what llhttp reports, whether
the bytes come in one read, byte by byte or in random splits.

The oracle feeds the whole response to a plain ``httptools.HttpResponseParser`` that records every callback, and
applies EPP's documented extra rules (status, transfer coding, head limit, one response only) to what
llhttp reported. httptools has no ``llhttp_finish``, so whether the end of the connection completes a response
(a body that runs to EOF) is asked of llhttp itself through ctypes, in the same library.
"""

from __future__ import annotations

import ctypes
import random
from dataclasses import dataclass

import httptools
import httptools.parser.parser as httptools_parser
import pytest

from epp.http1.response import CHUNKED, MAX_HEAD, TO_EOF, ResponseError, ResponseParser

# -- the oracle ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What a parser made of one response followed by the end of the connection (``None`` fields when refused)."""

    accepted: bool
    status: int | None = None
    headers: tuple[tuple[bytes, bytes], ...] | None = None
    body: bytes | None = None
    keep_alive: bool | None = None
    ended_before_eof: bool | None = None


REFUSED = Verdict(False)


class _Llhttp:
    """llhttp's own ``llhttp_finish`` verdict, through ctypes (the symbols httptools' extension exports)."""

    HTTP_RESPONSE = 2

    def __init__(self) -> None:
        lib = ctypes.CDLL(httptools_parser.__file__)
        for name in ("llhttp_init", "llhttp_settings_init", "llhttp_execute", "llhttp_finish"):
            assert hasattr(lib, name), f"httptools no longer exports {name}"
        lib.llhttp_execute.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.llhttp_finish.argtypes = [ctypes.c_void_p]
        lib.llhttp_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        lib.llhttp_settings_init.argtypes = [ctypes.c_void_p]
        self.lib = lib

    def eof_completes(self, data: bytes) -> bool:
        """Whether llhttp, after ``data``, accepts the end of the connection (``HPE_OK`` from ``llhttp_finish``)."""
        settings = ctypes.create_string_buffer(1024)  # larger than llhttp_settings_t; no callbacks set
        parser = ctypes.create_string_buffer(1024)  # larger than llhttp_t
        self.lib.llhttp_settings_init(settings)
        self.lib.llhttp_init(parser, self.HTTP_RESPONSE, settings)
        if self.lib.llhttp_execute(parser, data, len(data)) != 0:
            return False
        return self.lib.llhttp_finish(parser) == 0


LLHTTP = _Llhttp()


class _Recorder:
    """Every callback of a plain httptools parser, in order."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.final_head = False
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.events.append(("begin",))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.events.append(("header", name, value))

    def on_headers_complete(self) -> None:
        p = self.parser
        self.events.append(("head", p.get_status_code(), p.get_http_version()))
        self.final_head = self.final_head or p.get_status_code() >= 200

    def on_body(self, body: bytes) -> None:
        self.events.append(("body", body))

    def on_message_complete(self) -> None:
        self.events.append(("end", self.parser.should_keep_alive()))


def _only_chunked(values: list[bytes]) -> bool:
    """EPP's transfer-coding rule, stated independently: the elements of all the lines are one ``chunked``, and
    llhttp frames the body as chunked (which it does when the last line ends in ``chunked``)."""
    elements = [e.strip(b" \t").lower() for e in b",".join(values).split(b",") if e.strip(b" \t")]
    return elements == [b"chunked"] and values[-1].lower().endswith(b"chunked")


def _head_length(data: bytes) -> int:
    """How many bytes llhttp needs before the final (non-1xx) head is complete; len + 1 if it never is."""
    rec = _Recorder()
    for i in range(len(data)):
        try:
            rec.parser.feed_data(data[i:i + 1])
        except Exception:  # noqa: BLE001 - a refused response: the head never completes
            return len(data) + 1
        if rec.final_head:
            return i + 1
    return len(data) + 1


def oracle(data: bytes) -> Verdict:
    """httptools fed ``data`` in one piece, then EPP's rules on what it reported (see the module docstring)."""
    rec = _Recorder()
    try:
        rec.parser.feed_data(data)
    except Exception:  # noqa: BLE001 - anything llhttp refuses (including a second response after close)
        return REFUSED
    headers: list[tuple[bytes, bytes]] = []
    final: tuple | None = None
    body: list[bytes] = []
    end: tuple | None = None
    for event in rec.events:
        kind = event[0]
        if kind == "begin":
            if end is not None:
                return REFUSED  # a second response after the one asked for
            if final is None:
                headers = []
        elif kind == "header" and final is None:
            headers.append((event[1], event[2]))
        elif kind == "head" and final is None:
            status = event[1]
            if status < 100 or status == 101:
                return REFUSED
            if status >= 200:
                codings = [v for n, v in headers if n.lower() == b"transfer-encoding"]
                if codings and not _only_chunked(codings):
                    return REFUSED
                final = event
        elif kind == "body" and final is not None:
            body.append(event[1])
        elif kind == "end" and final is not None:
            end = event
    if final is None:
        return REFUSED
    if len(data) > MAX_HEAD and _head_length(data) > MAX_HEAD:
        return REFUSED
    if end is None and not LLHTTP.eof_completes(data):
        return REFUSED  # cut short
    return Verdict(True, final[1], tuple((n, v.rstrip(b" \t")) for n, v in headers), b"".join(body),
                   end[1] if end is not None else False, end is not None)


# -- the layer under test --------------------------------------------------------------------------------------------


class _Chunks:
    """What a plain httptools parser sees in one read placed right after a chunked head."""

    def __init__(self) -> None:
        self.chunks = self.completed = 0
        self.body: list[bytes] = []
        self.parser = httptools.HttpResponseParser(self)
        self.parser.feed_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")

    def on_chunk_header(self) -> None:
        self.chunks += 1

    def on_chunk_complete(self) -> None:
        self.completed += 1

    def on_body(self, body: bytes) -> None:
        self.body.append(body)


def assert_whole_chunks(read: bytes, payload: bytes, count: int) -> None:
    """``whole_chunks`` told the truth: ``read`` is ``count`` complete chunks (none the last) carrying ``payload``,
    so it can be forwarded as received; for one chunk, the payload sits right before the final CRLF."""
    seen = _Chunks()
    try:
        seen.parser.feed_data(read)
        assert (seen.chunks, seen.completed, b"".join(seen.body)) == (count, count, payload), read
        seen.parser.feed_data(b"0\r\n\r\n")  # it ended between two chunks: the last chunk may follow at once
    except httptools.HttpParserError as exc:
        raise AssertionError(f"not whole chunks: {read!r}: {exc}") from None
    if count == 1:
        assert read[len(read) - len(payload) - 2:-2] == payload


def layer(reads: list[bytes]) -> Verdict:
    """``ResponseParser`` fed ``reads``, then the end of the connection."""
    parser = ResponseParser()
    body: list[bytes] = []
    try:
        for read in reads:
            body.append(parser.feed(read))
            if parser.whole_chunks:
                assert_whole_chunks(read, body[-1], parser.whole_chunks)
    except ResponseError:
        return REFUSED
    ended = parser.done
    if not ended and not parser.feed_eof():
        return REFUSED
    assert (parser.framing == TO_EOF) == (not ended), "a body framed to EOF must end only with the connection"
    return Verdict(True, parser.status, tuple(parser.headers), b"".join(body), parser.keep_alive, ended)


def splits(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 12)))) if len(data) > 1 else []
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(data)})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


def check(data: bytes, rng: random.Random, cuts: list[int] | None = None) -> Verdict:
    """The layer agrees with the oracle in one read, byte by byte, in a random split and, given ``cuts`` (where
    the head ends and each chunk starts), one chunk per read; returns the verdict."""
    expected = oracle(data)
    assert layer([data]) == expected, "one read"
    assert layer([data[i:i + 1] for i in range(len(data))]) == expected, "byte by byte"
    assert layer(splits(data, rng)) == expected, "random split"
    if cuts:
        assert layer(split_at(data, cuts)) == expected, "one chunk per read"
    return expected


# -- the curated corpus ----------------------------------------------------------------------------------------------

OK = b"HTTP/1.1 200 OK\r\n"
CHUNKED_OK = OK + b"Transfer-Encoding: chunked\r\n\r\n"


def _big_head(size: int) -> bytes:
    """A response whose head is exactly ``size`` bytes, followed by a one-byte body."""
    fixed = OK + b"X-Big: \r\nContent-Length: 1\r\n\r\n"
    return OK + b"X-Big: " + b"a" * (size - len(fixed)) + b"\r\nContent-Length: 1\r\n\r\nx"

ACCEPTED = {
    "content-length": OK + b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    "content-length-zero": OK + b"Content-Length: 0\r\n\r\n",
    "content-length-trailing-blank": OK + b"Content-Length: 2 \r\n\r\n{}",
    "chunked": CHUNKED_OK + b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    "chunked-hex-zeros-extensions": CHUNKED_OK + b"0005;a=b\r\nhello\r\nA;q=\"x y\"\r\n0123456789\r\n0\r\n\r\n",
    "chunked-trailers": CHUNKED_OK + b"2\r\n{}\r\n0\r\nX-Trailer: 1\r\nX-Other: 2\r\n\r\n",
    "chunked-list-leading-comma": OK + b"Transfer-Encoding: , chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "chunked-upper-case": OK + b"Transfer-Encoding: CHUNKED\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "to-eof": OK + b"Content-Type: text/plain\r\n\r\nall of it, to the end",
    "to-eof-empty": OK + b"\r\n",
    "http10-to-eof": b"HTTP/1.0 200 OK\r\n\r\nold",
    "http10-keep-alive": b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx",
    "connection-close": OK + b"Connection: close\r\nContent-Length: 1\r\n\r\nx",
    "connection-list-close": OK + b"Connection: x-other, Close\r\nContent-Length: 1\r\n\r\nx",
    "no-reason": b"HTTP/1.1 200\r\nContent-Length: 1\r\n\r\nx",
    "204-with-length": b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
    "304-with-chunked": b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
    "100-continue": b"HTTP/1.1 100 Continue\r\n\r\n" + OK + b"Content-Length: 2\r\n\r\n{}",
    "103-then-102": (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
                     + OK + b"Content-Length: 2\r\n\r\n{}"),
    "150-with-body": b"HTTP/1.1 150 Odd\r\nContent-Length: 1\r\n\r\nz" + OK + b"Content-Length: 2\r\n\r\n{}",
    "leading-crlf": b"\r\n" + OK + b"Content-Length: 1\r\n\r\nx",
    "trailing-crlf": OK + b"Content-Length: 1\r\n\r\nx\r\n",
    "empty-value-and-obs-text": OK + b"X-Empty:\r\nX-Bytes: caf\xc3\xa9 \xff\r\nContent-Length: 1\r\n\r\nx",
    "500": b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops",
    "http2-line-read-as-1.0": b"HTTP/2.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
    "http09-line-read-as-1.0": b"HTTP/0.9 200 OK\r\nContent-Length: 1\r\n\r\nx",
    "head-at-limit": _big_head(MAX_HEAD),
}

REFUSED_CASES = {
    "empty": b"",
    "not-http": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "spdy": b"SPDY/9 what\r\n\r\n",
    "http12-line": b"HTTP/1.2 200 OK\r\nContent-Length: 1\r\n\r\nx",
    "status-099": b"HTTP/1.1 099 Low\r\nContent-Length: 1\r\n\r\nx",
    "status-4-digits": b"HTTP/1.1 2000 OK\r\nContent-Length: 1\r\n\r\nx",
    "status-superscript": "HTTP/1.1 \u00b200 OK\r\nContent-Length: 1\r\n\r\nx".encode(),
    "status-double-space": b"HTTP/1.1  200 OK\r\nContent-Length: 1\r\n\r\nx",
    "101-upgrade": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\nPRI",
    "101-bare": b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    "head-over-limit": _big_head(MAX_HEAD + 1),
    "interim-heads-over-limit": b"HTTP/1.1 103 Early Hints\r\n\r\n" * (MAX_HEAD // 27 + 1) + OK + b"\r\n",
    "truncated-head": OK + b"Content-Length: 1\r\n",
    "truncated-length": OK + b"Content-Length: 10\r\n\r\nabc",
    "truncated-chunked": CHUNKED_OK + b"5\r\nhel",
    "truncated-before-last-chunk": CHUNKED_OK + b"5\r\nhello\r\n",
    "longer-than-length": OK + b"Content-Length: 2\r\n\r\n{}abc",
    "longer-than-length-close": OK + b"Connection: close\r\nContent-Length: 2\r\n\r\n{}abc",
    "second-response": OK + b"Content-Length: 2\r\n\r\n{}" + OK + b"Content-Length: 2\r\n\r\n{}",
    "204-with-body": b"HTTP/1.1 204 No Content\r\n\r\nhello",
    "after-last-chunk": CHUNKED_OK + b"2\r\n{}\r\n0\r\n\r\nextra",
    "duplicate-length": OK + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
    "conflicting-length": OK + b"Content-Length: 2\r\nContent-Length: 5\r\n\r\n{}abc",
    "length-list": OK + b"Content-Length: 2, 2\r\n\r\n{}",
    "length-signed": OK + b"Content-Length: +2\r\n\r\n{}",
    "length-empty": OK + b"Content-Length: \r\n\r\n{}",
    "length-overflow": OK + b"Content-Length: " + b"9" * 30 + b"\r\n\r\n{}",
    "length-and-chunked": OK + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "gzip-chunked": OK + b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "chunked-gzip": OK + b"Transfer-Encoding: chunked, gzip\r\n\r\nxx",
    "chunked-twice": OK + b"Transfer-Encoding: chunked, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "chunked-trailing-tab": OK + b"Transfer-Encoding: chunked\t\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "chunked-trailing-comma": OK + b"Transfer-Encoding: chunked,\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "gzip-alone": OK + b"Transfer-Encoding: gzip\r\n\r\nxx",
    "te-empty": OK + b"Transfer-Encoding: \r\n\r\n",
    "chunk-size-negative": CHUNKED_OK + b"-6\r\nXXXX\r\n0\r\n\r\n",
    "chunk-size-0x": CHUNKED_OK + b"0x5\r\nhello\r\n0\r\n\r\n",
    "chunk-size-space-before-ext": CHUNKED_OK + b"5 ;a\r\nhello\r\n0\r\n\r\n",
    "chunk-size-empty": CHUNKED_OK + b"\r\nhello\r\n0\r\n\r\n",
    "chunk-size-overflow": CHUNKED_OK + b"1" * 17 + b"\r\n",
    "chunk-without-crlf": CHUNKED_OK + b"2\r\n{}XX0\r\n\r\n",
    "chunk-bare-lf-after-data": CHUNKED_OK + b"2\r\n{}\n0\r\n\r\n",
    "chunk-bare-lf-after-size": CHUNKED_OK + b"2\n{}\r\n0\r\n\r\n",
    "bare-lf-head": b"HTTP/1.1 200 OK\nContent-Length: 2\n\n{}",
    "bare-cr-in-value": OK + b"X: a\rb\r\nContent-Length: 1\r\n\r\nx",
    "name-with-space": OK + b"Bad Name: x\r\nContent-Length: 1\r\n\r\nx",
    "space-before-colon": OK + b"X : a\r\nContent-Length: 1\r\n\r\nx",
    "empty-name": OK + b": x\r\nContent-Length: 1\r\n\r\nx",
    "control-char-value": OK + b"X: a\x01b\r\nContent-Length: 1\r\n\r\nx",
    "del-in-value": OK + b"X: a\x7fb\r\nContent-Length: 1\r\n\r\nx",
    "nul-in-value": OK + b"X: a\x00b\r\nContent-Length: 1\r\n\r\nx",
    "obs-fold": OK + b"X: a\r\n folded\r\nContent-Length: 1\r\n\r\nx",
    "close-after-100": b"HTTP/1.1 100 Continue\r\nConnection: close\r\n\r\n" + OK + b"Content-Length: 0\r\n\r\n",
    "only-interim": b"HTTP/1.1 100 Continue\r\n\r\n",
}


@pytest.mark.parametrize("data", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_curated_accepted_responses_agree(data: bytes) -> None:
    assert check(data, random.Random(data)).accepted


def test_the_head_limit_cases_sit_on_the_limit() -> None:
    assert _head_length(ACCEPTED["head-at-limit"]) == MAX_HEAD
    assert _head_length(REFUSED_CASES["head-over-limit"]) == MAX_HEAD + 1


@pytest.mark.parametrize("data", list(REFUSED_CASES.values()), ids=list(REFUSED_CASES))
def test_curated_refused_responses_agree(data: bytes) -> None:
    assert not check(data, random.Random(data)).accepted


# -- the fuzz --------------------------------------------------------------------------------------------------------

_SAFE_NAMES = [b"Content-Type", b"X-A", b"Server", b"Date"]
_NAMES = [b"Content-Type", b"Content-Length", b"Transfer-Encoding", b"Connection", b"X-A", b"Server", b"Date",
          b"content-length", b"TRANSFER-ENCODING", b"X Bad", b"X\x01", b""]
_VALUES = [b"application/json", b"text/event-stream", b"chunked", b"gzip, chunked", b"close", b"keep-alive", b"2",
           b"0", b"  padded  ", b"a\tb", b"caf\xc3\xa9", b"\x7f", b"", b"100", b"chunked\t"]
_NOISE = [b"\r", b"\n", b"\r\n", b" ", b"\t", b":", b"0", b"9", b"f", b";", b"\x00", b"\x80", b"HTTP/1.1 200 OK\r\n"]


def _response(rng: random.Random) -> tuple[bytes, list[int]]:
    """A response from a small grammar (mostly well-formed): interim heads, status line, headers, a framed body,
    sometimes something after it; and the offsets where the body and each chunk start."""
    out = b"".join(b"HTTP/1.1 1%02d X\r\n\r\n" % rng.choice([0, 2, 3]) for _ in range(rng.choice([0, 0, 0, 1, 2])))
    version = rng.choice([b"1.1"] * 8 + [b"1.0", b"2.0"])
    status = rng.choice([b"200 OK"] * 6 + [b"204 No Content", b"304 NM", b"404 Not Found", b"500", b"101 S"])
    out += b"HTTP/%b %b\r\n" % (version, status)
    body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
    framing = rng.choice(["length"] * 3 + ["chunked"] * 3 + ["eof", "random"])
    headers = [(rng.choice(_SAFE_NAMES), rng.choice(_VALUES[:2])) for _ in range(rng.randrange(0, 3))]
    if framing == "length":
        headers.append((b"Content-Length", b"%d" % (len(body) + rng.choice([0] * 8 + [-1, 1]))))
    elif framing == "chunked":
        headers.append((b"Transfer-Encoding", b"chunked"))
    elif framing == "random":
        headers += [(rng.choice(_NAMES), rng.choice(_VALUES)) for _ in range(rng.randrange(1, 4))]
    if rng.random() < 0.2:
        headers.append((b"Connection", rng.choice([b"close", b"keep-alive"])))
    rng.shuffle(headers)
    out += b"".join(b"%b: %b\r\n" % h for h in headers) + b"\r\n"
    cuts = [len(out)]
    if framing == "chunked":
        pos = 0
        while pos < len(body):
            n = rng.randint(1, len(body) - pos)
            ext = rng.choice([b"", b"", b";a=1"])
            out += b"%x%b\r\n%b\r\n" % (n, ext, body[pos:pos + n])
            cuts.append(len(out))
            pos += n
        out += b"0\r\n" + rng.choice([b"", b"", b"X-T: 1\r\n"]) + b"\r\n"
    else:
        out += body
    if rng.random() < 0.05:
        out += rng.choice([b"\r\n", b"junk", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"])
    return out, cuts


def _mutate(data: bytes, rng: random.Random) -> bytes:
    """A few random edits: insert noise, delete or replace a byte."""
    buf = bytearray(data)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        pos = rng.randrange(len(buf) + 1)
        op = rng.random()
        if op < 0.4 or not buf:
            buf[pos:pos] = rng.choice(_NOISE)
        elif op < 0.7:
            del buf[min(pos, len(buf) - 1)]
        else:
            buf[min(pos, len(buf) - 1)] = rng.randrange(256)
    return bytes(buf)


def test_seeded_fuzz_agrees_with_httptools() -> None:
    rng = random.Random(30)
    accepted = refused = 0
    for case in range(3000):
        data, cuts = _response(rng)
        if case % 3 == 0:
            data = _mutate(data, rng)  # the cuts still split it, no longer on chunk starts
        try:
            verdict = check(data, rng, cuts)
        except AssertionError as exc:
            raise AssertionError(f"case {case}: {data!r}: {exc}") from None
        accepted += verdict.accepted
        refused += not verdict.accepted
    assert accepted > 1000 and refused > 1000  # the grammar reaches both sides, not one


# -- chunk boundaries, the head limit, linear cost ------------------------------------------------------------------

def test_reads_of_whole_chunks_are_reported_with_their_payload_position() -> None:
    """Fed one chunk per read (the relay's per-token case), each read is reported as one whole chunk whose
    payload is ``read[len(read) - len(payload) - 2:-2]``; a read of two chunks reports two; a read that ends
    inside a chunk, or carries the last chunk, reports none."""
    parser = ResponseParser()
    assert parser.feed(CHUNKED_OK) == b"" and parser.head_done and parser.framing == CHUNKED
    for read, payload, whole in [
        (b"5\r\nhello\r\n", b"hello", 1),
        (b"00A;x=1\r\n0123456789\r\n", b"0123456789", 1),
        (b"1\r\na\r\n2\r\nbc\r\n", b"abc", 2),
        (b"3\r\nde", b"de", 0),
        (b"f\r\n", b"f", 0),
        (b"1\r\ng\r\n", b"g", 1),
        (b"1\r\nh\r\n0\r\n\r\n", b"h", 0),
    ]:
        assert parser.feed(read) == payload and parser.whole_chunks == whole, read
        if whole == 1:
            assert read[len(read) - len(payload) - 2:-2] == payload
    assert parser.done and parser.keep_alive


class _CountingParser:
    """Stands in for the httptools parser to count what reaches llhttp."""

    def __init__(self, real: httptools.HttpResponseParser) -> None:
        self.real = real
        self.calls = 0
        self.fed = 0

    def feed_data(self, data: bytes | memoryview) -> None:
        self.calls += 1
        self.fed += len(data)
        self.real.feed_data(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)


def test_a_head_in_single_bytes_reaches_llhttp_in_few_large_pieces() -> None:
    """httptools joins the pieces of a header split across reads by copying, so a long header fed a byte at a time
    would cost quadratic time: bytes without a line end are held back and reach llhttp about once per KB."""
    value = b"v" * 40_000
    data = OK + b"X-Long: " + value + b"\r\nContent-Length: 1\r\n\r\nx"
    parser = ResponseParser()
    counting = parser._parser = _CountingParser(parser._parser)  # type: ignore[assignment]
    body = b"".join(parser.feed(data[i:i + 1]) for i in range(len(data)))
    assert parser.done and body == b"x" and (b"X-Long", value) in parser.headers
    assert counting.fed == len(data)
    assert counting.calls < len(data) // 1024 + 10


@pytest.mark.parametrize("step", [1, 7, 4096], ids=["byte", "7-bytes", "4-KB"])
def test_an_endless_head_is_refused_at_the_limit_without_holding_more(step: int) -> None:
    parser = ResponseParser()
    data = OK + b"X-Endless: " + b"a" * (2 * MAX_HEAD)
    with pytest.raises(ResponseError, match="head larger than"):
        for i in range(0, len(data), step):
            parser.feed(data[i:i + step])
            held = parser._pending
            assert held is None or len(held) <= MAX_HEAD
    assert i < MAX_HEAD + step  # refused as soon as the limit was passed


def test_endless_trailers_are_refused_at_the_limit() -> None:
    """Trailers are skipped, but a trailer that never ends would be joined by httptools for ever."""
    parser = ResponseParser()
    parser.feed(CHUNKED_OK + b"2\r\n{}\r\n0\r\nX-Trailer: ")
    with pytest.raises(ResponseError, match="trailers"):
        for _ in range(2 * MAX_HEAD // 1000):
            parser.feed(b"t" * 1000)
