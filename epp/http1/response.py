"""HTTP/1.1 response parsing on llhttp (``httptools.HttpResponseParser``, every leniency off), shared by the gateway's
upstream proxy client and the metrics scraper. Sans-I/O: one :class:`ResponseParser` per connection.

``begin()`` before each response; ``feed(read)`` returns the body bytes of that read (``head_done``, ``done``,
``whole_chunks`` say where the response stands); ``feed_eof()`` ends a body that runs to the end of the connection.
1xx interim answers are skipped; framing is llhttp's (RFC 9112 §6.3). :class:`ResponseError` is raised for what
strict llhttp refuses and for EPP's own rules (no transfer coding but chunked alone, nothing after the response, a
bounded head); after an error the parser and its connection are not to be used again. Parsing is linear however the
head is split; ``tests/gateway/test_http1_response_differential.py`` holds every path to llhttp's verdict.
"""

from __future__ import annotations

import httptools
from httptools import HttpParserError, HttpParserUpgrade

__all__ = ["CHUNKED", "LENGTH", "MAX_HEAD", "NO_BODY", "TO_EOF", "ResponseError", "ResponseParser"]

MAX_HEAD = 64 * 1024
NO_BODY, LENGTH, CHUNKED, TO_EOF = range(4)
_COALESCE = 1024  # head reads shorter than this and without a line end wait for more (see the module docstring)
_HEX_DIGITS = b"0123456789abcdefABCDEF"

# llhttp's error reasons, sorted into what EPP reports (first match wins; the reason itself follows in brackets).
_LABELS = (
    ("chunk size", "bad chunk size"),
    ("chunk", "bad chunk framing"),
    ("can't be present", "both Transfer-Encoding and Content-Length"),
    ("Content-Length", "bad Content-Length"),
    ("Transfer-Encoding", "bad Transfer-Encoding"),
    ("Data after", "more data after the end of the response"),
    ("header", "malformed header"),
    ("HTTP/", "malformed status line"),
    ("version", "malformed status line"),
    ("status", "malformed status line"),
    ("response line", "malformed status line"),
)


class ResponseError(Exception):
    """A malformed or hostile response: the connection it came on must be dropped."""


def _error(exc: Exception) -> ResponseError:
    """The :class:`ResponseError` for an httptools exception: ours when a callback raised it, else llhttp's reason
    under a label."""
    if isinstance(exc.__context__, ResponseError):
        return exc.__context__
    if isinstance(exc, HttpParserUpgrade):
        return ResponseError("unexpected protocol switch")
    reason = str(exc)
    for key, label in _LABELS:
        if key in reason:
            return ResponseError(f"{label} ({reason})")
    return ResponseError(f"malformed response ({reason})")


class ResponseParser:
    """Parses the responses of one connection (see the module docstring)."""

    __slots__ = ("_boundary", "_budget", "_chunks", "_interim", "_max_head", "_parser", "_parts", "_pending",
                 "_quiet", "_raw", "content_length", "done", "framing", "head_done", "headers", "keep_alive", "status",
                 "whole_chunks")

    def __init__(self, max_head: int = MAX_HEAD) -> None:
        self._max_head = max_head
        # One llhttp parser for the connection's life: it moves on to the next response by itself, and making one
        # costs more than parsing a small response.
        self._parser = httptools.HttpResponseParser(self)
        self.begin()

    def begin(self) -> None:
        """Expect the next response (on a fresh connection, or one whose previous response is ``done``)."""
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []  # names as sent, values without surrounding blanks
        self._raw: list[tuple[bytes, bytes]] = []  # as llhttp gives them (then trailers, ignored)
        self.content_length: int | None = None
        self.framing = NO_BODY
        self.head_done = False
        self.done = False
        self.keep_alive = False
        self.whole_chunks = 0
        self._interim = False
        self._parts: list[bytes] = []
        self._pending: bytearray | None = None
        self._budget = self._max_head
        self._quiet = 0
        self._boundary = False
        self._chunks = 0

    # -- feeding ------------------------------------------------------------------------------------------------

    def feed(self, data: bytes) -> bytes:
        """Parse one read; returns the body bytes it carried. Raises :class:`ResponseError`."""
        boundary = self._boundary  # only ever True once the head is done
        if boundary:
            # A relayed stream's common read, one whole chunk ("<hex size>\r\n<data>\r\n": one SSE event as the
            # server wrote it), taken without llhttp: it would accept it and end where it began, between chunks.
            # Anything else (extensions, more or less than one chunk, the last chunk) goes to llhttp.
            eol = data.find(b"\r\n")
            if 0 < eol <= 16:
                line = data[:eol]
                if not line.strip(_HEX_DIGITS):
                    size = int(line, 16)
                    if size and len(data) == eol + size + 4 and data[-2:] == b"\r\n":
                        self.whole_chunks = 1
                        self._quiet = 0
                        return data[eol + 2:-2]
        elif not self.head_done:
            return self._feed_head(data)
        self._chunks = 0
        try:
            self._parser.feed_data(data)
        except (HttpParserError, HttpParserUpgrade) as exc:
            raise _error(exc) from None
        # Between chunks only if the read ended with a chunk's CRLF: bytes of a size line after it leave llhttp
        # mid-line without a callback.
        end = self._boundary = self._boundary and data.endswith(b"\r\n")
        parts = self._parts
        if not parts:
            self.whole_chunks = 0
            self._quiet += len(data)
            if self._quiet > self._max_head:  # httptools would keep joining a trailer that never ends
                raise ResponseError(f"chunk framing or trailers over {self._max_head} bytes without data")
            return b""
        self._quiet = 0
        self._parts = []
        # Started and ended between two chunks, and not the last one: the read can be relayed as received.
        self.whole_chunks = self._chunks if boundary and end and not self.done else 0
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def feed_eof(self) -> bool:
        """The connection ended: True when that completes the response (a body that runs to the end of the
        connection; ``keep_alive`` is then False); False otherwise (cut short, or already ``done``)."""
        if self.head_done and not self.done and self.framing == TO_EOF:
            self.done, self.keep_alive = True, False
            return True
        return False

    def _feed_head(self, data: bytes) -> bytes:
        pending = self._pending
        if pending is not None:
            pending += data
            if len(pending) < _COALESCE and b"\n" not in data:
                return self._hold(pending)
            data, self._pending = bytes(pending), None
        elif len(data) < _COALESCE and b"\n" not in data:
            self._pending = pending = bytearray(data)
            return self._hold(pending)
        budget = self._budget
        if len(data) <= budget:
            self._execute(data)
            if not self.head_done:
                self._budget = budget - len(data)
                return b""
        else:  # only the head's remaining budget goes in first, so the limit is exact whatever the reads
            view = memoryview(data)
            self._execute(view[:budget])
            if not self.head_done:
                raise ResponseError(f"response head larger than {self._max_head} bytes")
            self._execute(view[budget:])
        self._boundary = self._boundary and data.endswith(b"\r\n")  # as in feed()
        parts, self._parts = self._parts, []
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _hold(self, pending: bytearray) -> bytes:
        """Held-back bytes hold no line end, so the head cannot end within them: past the budget it is too long."""
        if len(pending) > self._budget:
            raise ResponseError(f"response head larger than {self._max_head} bytes")
        return b""

    def _execute(self, data: bytes | memoryview) -> None:
        try:
            self._parser.feed_data(data)
        except (HttpParserError, HttpParserUpgrade) as exc:
            raise _error(exc) from None

    # -- llhttp callbacks -----------------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.done:  # a second response where one was asked for: the first one's framing lied
            raise ResponseError("more data after the end of the response")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        raw, self._raw = self._raw, []  # trailers, if any, go to the fresh list and are never read
        if status < 200:
            if status < 100 or status == 101:
                raise ResponseError(f"malformed status line (status {status:03d})" if status < 100
                                    else "unexpected protocol switch (101)")
            self._interim = True  # an interim answer: the real head follows
            return
        self.status = status
        self._set_framing(raw)
        self.head_done = True
        self._boundary = self.framing == CHUNKED  # between two chunks (before the first one)

    def on_body(self, body: bytes) -> None:
        self._parts.append(body)

    def on_chunk_header(self) -> None:
        self._boundary = False
        self._chunks += 1

    def on_chunk_complete(self) -> None:
        self._boundary = True

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            self._parts = []  # a 1xx answer's body (llhttp frames one if announced) is not the response's
            return
        self.keep_alive = self._parser.should_keep_alive()  # before llhttp resets its flags for the next message
        self.done = True

    def _set_framing(self, raw: list[tuple[bytes, bytes]]) -> None:
        """Fill ``headers`` and set how the body is delimited, as llhttp will (it has already refused repeated
        lengths, and Content-Length with Transfer-Encoding); refuse a transfer coding other than chunked alone."""
        headers = self.headers
        codings: list[bytes] = []
        for name, value in raw:
            if len(name) in (14, 17):  # the two framing headers' lengths: the others cost no lower()
                low = name.lower()
                if low == b"content-length":
                    self.content_length = int(value)  # llhttp checked: digits, one line, no overflow
                elif low == b"transfer-encoding":
                    codings.append(value)  # unstripped: llhttp reads "chunked\t" as not chunked
            # llhttp drops leading blanks and refuses control characters: rstrip() removes trailing blanks only.
            headers.append((name, value.rstrip()))
        if codings:
            # llhttp: chunked when the last line's last element is "chunked" (blanks before it only).
            chunked = codings[-1].rpartition(b",")[2].lstrip(b" \t").lower() == b"chunked"
            listed = [c.strip(b" \t") for c in b",".join(codings).lower().split(b",")]
            if not chunked or [c for c in listed if c] != [b"chunked"]:
                shown = b", ".join(codings).decode("latin-1")[:40]
                raise ResponseError(f"unsupported Transfer-Encoding {shown!r} (only chunked is accepted)")
        if self.status in (204, 304):
            self.framing = NO_BODY
        elif codings:
            self.framing = CHUNKED
        elif self.content_length is not None:
            self.framing = LENGTH if self.content_length else NO_BODY
        else:
            self.framing = TO_EOF
