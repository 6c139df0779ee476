"""Token usage read out of a response body as it streams past: the one reader both front ends use.

:class:`UsageReader` is fed every body chunk in order (:meth:`~UsageReader.feed`, which never raises) and asked
:meth:`~UsageReader.usage` once after the last. An event stream is scanned for the *last* complete line whose
``"usage"`` key holds an object; only that line's bytes are kept, and parsed once at the end (with vLLM's continuous
usage stats every event carries the usage so far, so the last one is the total). A JSON body is kept, up to 8 MiB,
and parsed once at the end. :class:`MessagesUsageReader` reads the Anthropic Messages shapes (the prompt from the
first usage event, ``message_start``; the completion from the last). :func:`usage_from_body` and
:func:`messages_usage_from_body` read a complete JSON body. Byte searches are written ``data.find(key) >= 0``, not
``key in data``: on CPython 3.11 ``in`` on bytes first builds and drops a TypeError (twice the cost per chunk).
"""

from __future__ import annotations

from typing import Any

import orjson

from epp.usage.shapes import NO_USAGE, Usage, messages_stream_usage, messages_usage, usage_of

__all__ = ["UsageReader", "MessagesUsageReader", "usage_from_body", "messages_usage_from_body", "event_json"]

_USAGE_KEY = b'"usage"'
_MAX_JSON = 8 << 20  # a JSON answer above this is not parsed for usage
_MAX_LINE = 1 << 20  # an SSE line above this is not tracked (nothing real is that long)


def usage_from_body(body: bytes) -> Usage:
    """Usage of a complete JSON answer; :data:`~epp.usage.shapes.NO_USAGE` if it is not JSON or has none."""
    return usage_of(_json_with_usage(body))


def messages_usage_from_body(body: bytes) -> Usage:
    """Usage of a complete Anthropic Messages JSON answer; ``NO_USAGE`` if it is not JSON or has none."""
    return messages_usage(_json_with_usage(body))


def _json_with_usage(body: bytes) -> Any:
    """``body`` parsed when it may hold a usage object; None when it cannot or is not JSON."""
    if body.find(_USAGE_KEY) < 0:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def event_json(line: bytes | None) -> Any:
    """The JSON of one SSE ``data:`` line; None for no line, ``[DONE]`` or a line that is not JSON."""
    if line is None:
        return None
    line = line.strip()
    if line.startswith(b"data:"):
        line = line[5:].strip()
    if not line or line == b"[DONE]":
        return None
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return None


def _usage_object_at(buf: bytes, key_at: int) -> bool:
    """Whether the ``"usage"`` key at ``key_at`` has an object value (``"usage":null`` does not count)."""
    i = key_at + len(_USAGE_KEY)
    n = len(buf)
    while i < n and buf[i] in b" \t:":
        i += 1
    return i < n and buf[i] == 0x7B  # '{'


def _line_around(buf: bytes, at: int, end: int) -> bytes:
    start = buf.rfind(b"\n", 0, at) + 1
    stop = buf.find(b"\n", at, end)
    return buf[start:stop if stop >= 0 else end]


def _last_usage_line(buf: bytes, end: int) -> bytes | None:
    """The last line of ``buf[:end]`` whose ``"usage"`` key holds an object, or None."""
    stop_at = end
    while (at := buf.rfind(_USAGE_KEY, 0, stop_at)) >= 0:
        if _usage_object_at(buf, at):
            return _line_around(buf, at, end)
        stop_at = at
    return None


def _first_usage_line(buf: bytes, end: int) -> bytes | None:
    """The first line of ``buf[:end]`` whose ``"usage"`` key holds an object, or None."""
    at = buf.find(_USAGE_KEY, 0, end)
    while at >= 0:
        if _usage_object_at(buf, at):
            return _line_around(buf, at, end)
        at = buf.find(_USAGE_KEY, at + len(_USAGE_KEY), end)
    return None


class UsageReader:
    """Reads the usage of one answer as its body passes: an event stream (``sse``) or one JSON document.

    Contract: :meth:`feed` every chunk in order (or :meth:`feed_chunk` a framed HTTP chunk), then :meth:`usage`
    once. Lines split across chunks are joined; a chunk of whole lines without ``"usage"`` costs one byte search.
    """

    __slots__ = ("sse", "_parts", "_size", "_tail", "_last")

    def __init__(self, sse: bool = True) -> None:
        self.sse = sse
        self._parts: list[bytes] = []  # JSON: the body so far (dropped past _MAX_JSON)
        self._size = 0
        self._tail = b""  # SSE: the partial last line
        self._last: bytes | None = None  # SSE: the last usage-carrying line seen

    def feed(self, chunk: bytes) -> None:
        """Look at the next chunk of the body."""
        if not self.sse:
            self._size += len(chunk)
            if self._size <= _MAX_JSON:
                self._parts.append(chunk)
            return
        if not self._tail and chunk[-1:] == b"\n":  # whole lines, nothing carried over: SSE's usual chunk
            if chunk.find(_USAGE_KEY) >= 0:
                self._remember(chunk, len(chunk))
            return
        nl = chunk.rfind(b"\n")
        if nl < 0:
            self._tail = self._tail + chunk if len(self._tail) + len(chunk) <= _MAX_LINE else b""
            return
        if self._tail:  # a line was split across chunks: join it
            complete = self._tail + chunk[:nl]
            end = len(complete)
        else:  # a partial last line: search the complete ones in place, no copy
            complete, end = chunk, nl
        rest = chunk[nl + 1:]
        self._tail = rest if len(rest) <= _MAX_LINE else b""
        if complete.find(_USAGE_KEY, 0, end) >= 0:
            self._remember(complete, end)

    def feed_chunk(self, read: bytes, start: int) -> None:
        """:meth:`feed` for a read that is exactly one whole HTTP chunk (payload ``read[start:-2]``) of an event
        stream. The usual chunk, whole lines without ``"usage"`` (which the framing around it cannot hold), is
        skipped without copying the payload; any other is fed."""
        if not self._tail and read[-3] == 0x0A and read.find(_USAGE_KEY) < 0:
            return
        self.feed(read[start:-2])

    def usage(self) -> Usage:
        """The usage the body reported (a trailing line without newline included), or ``NO_USAGE``."""
        if not self.sse:
            return self._of_body(b"".join(self._parts) if self._size <= _MAX_JSON else b"")
        if self._tail and self._tail.find(_USAGE_KEY) >= 0:
            self._remember(self._tail, len(self._tail))
            self._tail = b""
        return NO_USAGE if self._last is None else self._of_stream()

    def _remember(self, buf: bytes, end: int) -> None:
        """Keep the last usage-carrying line of ``buf[:end]``, if any."""
        line = _last_usage_line(buf, end)
        if line is not None:
            self._last = line

    def _of_body(self, body: bytes) -> Usage:
        return usage_from_body(body)

    def _of_stream(self) -> Usage:
        return usage_of(event_json(self._last))


class MessagesUsageReader(UsageReader):
    """:class:`UsageReader` for the Anthropic Messages API: a JSON body is read in the Messages shape; a stream
    keeps its first usage-carrying event too (``message_start``, whose ``message.usage`` has the prompt counts) and
    combines it with the last one (``message_delta``: the completion count), as
    :func:`~epp.usage.shapes.messages_stream_usage`. Same contract as its base."""

    __slots__ = ("_start",)

    def __init__(self, sse: bool = True) -> None:
        super().__init__(sse)
        self._start: bytes | None = None

    def _remember(self, buf: bytes, end: int) -> None:
        if self._start is None:
            self._start = _first_usage_line(buf, end)
        super()._remember(buf, end)

    def _of_body(self, body: bytes) -> Usage:
        return messages_usage_from_body(body)

    def _of_stream(self) -> Usage:
        return messages_stream_usage(event_json(self._start), event_json(self._last))
