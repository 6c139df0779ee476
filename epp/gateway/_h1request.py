"""HTTP/1.1 request parsing for the gateway's own server (``_frontend``): the head, and bodies arriving in pieces;
and :func:`header_block`, the header serialization both the server and the lean upstream client write.

Pure functions and small state machines, no I/O. Errors are EPP errors, so the server answers them with the shared
status table: ``BadRequest`` (400) for anything malformed, ``PayloadTooLarge`` (413) for a body over the limit.
What is accepted: HTTP/1.0 and 1.1 request lines with origin-form or absolute-form targets; header names that are
ASCII tokens without whitespace; ``Content-Length`` of ASCII digits (repeats must agree); ``Transfer-Encoding``
of exactly ``chunked`` (HTTP/1.1 only, never together with ``Content-Length``), with chunk extensions and trailers
ignored; at most one ``Host`` (that HTTP/1.1 has one is the server's check). Of a repeated header the last value
is kept, except ``Transfer-Encoding``, whose lines form one list (RFC 9110 §5.3) so that no coding hides in an
earlier line. The path used for routing is percent-decoded as UTF-8 with invalid bytes replaced (U+FFFD), so that
it is always valid text; the raw target is kept as received.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote

from ..errors import BadRequest, NotImplementedByEpp, PayloadTooLarge

__all__ = ["ChunkedBody", "FixedBody", "HeadOverLimit", "MAX_HEAD", "RequestHead", "UNSUPPORTED_VERSION",
           "check_transfer_encoding", "header_block", "parse_head"]

MAX_HEAD = 128 * 1024
"""Largest request head accepted (request line and headers), in bytes."""

UNSUPPORTED_VERSION = "unsupported HTTP version (HTTP/1.0 and HTTP/1.1 are served)"

_MAX_CHUNK_LINE = 4096
_HEX = frozenset(b"0123456789abcdefABCDEF")


class RequestHead:
    """A parsed request head (and, once complete, its body)."""

    __slots__ = ("body", "expect", "headers", "keep_alive", "method", "path", "raw_path", "reader", "v11")

    def __init__(self, method: str, raw_path: str, path: str, v11: bool, headers: dict[str, str]) -> None:
        self.method = method
        self.raw_path = raw_path
        self.path = path
        self.v11 = v11
        self.headers = headers
        self.keep_alive = True
        self.expect = False
        self.reader: FixedBody | ChunkedBody | None = None
        self.body = b""


class HeadOverLimit(PayloadTooLarge):
    """A request head announcing a body over the limit; ``head`` is the parsed head (for the answer's
    ``x-request-id``)."""

    def __init__(self, message: str, head: RequestHead) -> None:
        super().__init__(message)
        self.head = head


def parse_head(head: bytes, body_limit: int) -> RequestHead:
    """Parse a request head (without its final blank line); raises ``BadRequest``, or ``HeadOverLimit`` (a
    ``PayloadTooLarge``) for an announced body over ``body_limit``."""
    lines = head.decode("utf-8", "surrogateescape").split("\r\n")  # one decode: names are checked to be ASCII
    _check_controls(head, len(lines) - 1)
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise BadRequest("malformed HTTP request line")
    method, target, version = parts
    if version == "HTTP/1.1":
        v11 = True
    elif version == "HTTP/1.0":
        v11 = False
    else:
        raise BadRequest(UNSUPPORTED_VERSION)
    if not method or not method.isupper() or not method.isascii():
        raise BadRequest("malformed HTTP method")
    raw_path, path = _target(target)
    headers: dict[str, str] = {}
    length: str | None = None
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or " " in name or "\t" in name or not name.isascii():
            raise BadRequest("malformed HTTP header line")
        key = name.lower()
        val = value.strip(" \t")
        if key == "content-length":
            if not (val.isascii() and val.isdigit()) or (length is not None and val != length):
                raise BadRequest("invalid Content-Length header")
            length = val
        headers[key] = val
    if len(headers) < len(lines) - 1:  # a header came more than once (rare): repeats of some have rules
        _repeats(lines, headers)
    req = RequestHead(method, raw_path, path, v11, headers)
    conn = headers.get("connection", "").lower()
    req.keep_alive = ("close" not in conn) if v11 else ("keep-alive" in conn)
    te = headers.get("transfer-encoding")
    if te is not None:
        check_transfer_encoding(te, v11=v11, has_length=length is not None)
        req.reader = ChunkedBody(body_limit)
    elif length is not None and length != "0" and int(length):
        size = int(length)
        if size > body_limit:
            raise HeadOverLimit(f"request body of {size} bytes exceeds the limit of {body_limit}", req)
        req.reader = FixedBody(size)
    # HTTP/1.0 clients cannot ask for 100 Continue (RFC 9110 §10.1.1): the expectation is ignored.
    req.expect = v11 and req.reader is not None and headers.get("expect", "").lower() == "100-continue"
    return req


_CONTROLS = b"\x00\r\n"


def _check_controls(head: bytes, line_ends: int) -> None:
    """``BadRequest`` for a NUL, or a CR or LF that is not part of one of the head's ``line_ends`` CRLFs: RFC 9110
    §5.5 lets a recipient reject them in field values, and forwarding them would let a client smuggle a header
    line (or a NUL) to the model server. One C-level pass (``translate`` deletes the three; only the CRLFs may
    go), a third of the cost of counting each."""
    if len(head) - len(head.translate(None, _CONTROLS)) != 2 * line_ends:
        raise BadRequest("invalid control character in the HTTP head (NUL, or CR or LF outside a line end)")


def _repeats(lines: list[str], headers: dict[str, str]) -> None:
    """Some header came more than once (``headers`` kept its last value): a second ``Host`` is an error (RFC 9112
    §3.2), and ``Transfer-Encoding`` lines form one list (RFC 9110 §5.3), so that no coding hides in an earlier
    line. (``Content-Length`` repeats are checked as they come.)"""
    hosts, codings = 0, []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        key = name.lower()
        if key == "host":
            hosts += 1
        elif key == "transfer-encoding":
            codings.append(value.strip(" \t"))
    if hosts > 1:
        raise BadRequest("more than one Host header")
    if len(codings) > 1:
        headers["transfer-encoding"] = ", ".join(codings)


def check_transfer_encoding(te: str, *, v11: bool, has_length: bool) -> None:
    """Pass a request's ``Transfer-Encoding`` (its lines joined with commas) that is exactly ``chunked`` in HTTP/1.1
    without ``Content-Length``; else raise its error: 400 in HTTP/1.0 or with ``Content-Length`` (the framing is
    faulty, RFC 9112 §6.1, §6.3), see :func:`_refuse_codings` for other codings. Shared by both front ends."""
    if has_length or not v11:
        raise BadRequest("invalid Transfer-Encoding (HTTP/1.1 only, without Content-Length)")
    if te.lower() != "chunked":
        _refuse_codings(te)


def _refuse_codings(te: str) -> None:
    """Raise the error for a ``Transfer-Encoding`` other than ``chunked``: 400 when ``chunked`` is not the final
    coding once (the body's end cannot be found, RFC 9112 §6.3), else the codings before it are not implemented
    (501, RFC 9112 §6.1)."""
    codings = [c.strip(" \t").lower() for c in te.split(",")]
    if codings[-1] != "chunked" or "chunked" in codings[:-1]:
        raise BadRequest("invalid Transfer-Encoding: chunked must be the final coding, applied once")
    raise NotImplementedByEpp("Transfer-Encoding: codings other than chunked are not implemented")


def header_block(headers: Mapping[str, str]) -> str:
    """``name: value\\r\\n`` for each header; a header whose name or value holds CR or LF is dropped, so it never
    smuggles another line into the message (checked once over the block, line by line only when that fails)."""
    text = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if text.count("\n") != len(headers) or text.count("\r") != len(headers):
        text = "".join([f"{name}: {value}\r\n" for name, value in headers.items()
                        if "\n" not in name + value and "\r" not in name + value])
    return text


def _target(target: str) -> tuple[str, str]:
    """(raw path with query, percent-decoded path without query) of a request target."""
    if not target.startswith("/"):
        if target.startswith(("http://", "https://")):
            slash = target.find("/", target.index("//") + 2)
            target = target[slash:] if slash >= 0 else "/"
        else:
            raise BadRequest("malformed request target")
    path = target.partition("?")[0]
    if "%" in path or not path.isascii():  # the target holds the head's non-UTF-8 bytes as surrogates
        path = unquote(path.encode("utf-8", "surrogateescape"), errors="replace")
    return target, path


class FixedBody:
    """A ``Content-Length`` body arriving in pieces."""

    __slots__ = ("left", "parts")

    def __init__(self, size: int) -> None:
        self.left = size
        self.parts: list[bytes] = []

    def feed(self, data: bytes) -> tuple[bool, bytes]:
        """Take body bytes; returns (complete, the bytes after the body)."""
        if len(data) < self.left:
            if data:
                self.parts.append(data)
                self.left -= len(data)
            return False, b""
        self.parts.append(data[:self.left])
        rest = data[self.left:]
        self.left = 0
        return True, rest

    def body(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


class ChunkedBody:
    """A ``Transfer-Encoding: chunked`` body arriving in pieces (incremental: each byte is looked at once)."""

    __slots__ = ("left", "limit", "parts", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.left = -1  # >0: data bytes left in this chunk; -1: size line; -2: CRLF after data; -3: trailers

    def feed(self, data: bytes) -> tuple[bool, bytes]:
        """Take bytes; returns (complete, the unconsumed bytes: after the body when complete, else a partial
        line to prepend to the next read). Raises ``BadRequest`` or ``PayloadTooLarge``."""
        pos, n, left = 0, len(data), self.left
        try:
            while pos < n:
                if left > 0:
                    take = min(left, n - pos)
                    self.parts.append(data[pos:pos + take])
                    pos += take
                    left -= take
                    if left == 0:
                        left = -2
                elif left == -2:
                    if n - pos < 2:
                        return False, data[pos:]
                    if data[pos:pos + 2] != b"\r\n":
                        raise BadRequest("chunk data not followed by CRLF")
                    pos += 2
                    left = -1
                else:
                    eol = data.find(b"\r\n", pos)
                    if eol < 0:
                        if n - pos > _MAX_CHUNK_LINE:
                            raise BadRequest("chunk size or trailer line too long")
                        return False, data[pos:]
                    line, pos = data[pos:eol], eol + 2
                    if left == -3:
                        if not line:
                            return True, data[pos:]
                        continue  # a trailer field: ignored
                    left = self._size(line)
            return False, b""
        finally:
            self.left = left

    def _size(self, line: bytes) -> int:
        digits = line.split(b";", 1)[0].strip(b" \t")
        if not digits or len(digits) > 16 or not _HEX.issuperset(digits):
            raise BadRequest("invalid chunk size")
        size = int(digits, 16)
        if size == 0:
            return -3
        self.size += size
        if self.size > self.limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {self.limit} bytes")
        return size

    def body(self) -> bytes:
        return b"".join(self.parts)
