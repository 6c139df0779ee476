"""Reading token usage out of response bodies as they stream past, and restoring a rewritten model name.

:class:`UsageReader` is fed every response body chunk in order and reports ``(prompt, completion, cached)`` once
the body ended. JSON bodies are kept (up to a cap) and parsed once at the end; SSE streams are scanned for the
last complete ``data:`` line whose ``"usage"`` holds an object. The reference takes the *first* such line; the two
agree for vLLM's default stream (one usage chunk, at the end) and differ with vLLM's continuous usage stats, where
every event carries the usage so far and only the last one is the total (EPP reports the total). Shapes:
chat/completions ``usage.{prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens}``; Responses API
``usage.{input_tokens, output_tokens, input_tokens_details.cached_tokens}`` (in SSE inside ``response``); the
Anthropic Messages API through :class:`MessagesUsageReader` (see :mod:`epp.usage`). Byte searches use ``find``
rather than ``in`` (see :mod:`epp.gateway._usage` for why).

:class:`ModelRestorer` rewrites ``"model":"<target>"`` back to the name the client sent. JSON bodies are held
and rewritten whole at the end; SSE streams are rewritten line by line, holding back only an incomplete last line.
"""

from __future__ import annotations


import orjson

from epp.usage import NO_USAGE, Usage, messages_stream_usage, messages_usage, usage_of

__all__ = ["Usage", "NO_USAGE", "UsageReader", "MessagesUsageReader", "ModelRestorer", "usage_of"]

_USAGE = b'"usage"'
_MAX_JSON = 8 << 20  # a non-streamed JSON response above this is not parsed for usage
_MAX_LINE = 1 << 20  # an SSE line above this is not tracked


def _has_usage_object(line: bytes) -> bool:
    at = line.find(_USAGE)
    while at >= 0:
        i = at + len(_USAGE)
        while i < len(line) and line[i] in b" \t:":
            i += 1
        if i < len(line) and line[i] == 0x7B:  # '{'
            return True
        at = line.find(_USAGE, i)
    return False


class UsageReader:
    """Feed every response body chunk with :meth:`feed`; read :meth:`usage` after the last one.

    ``sse`` selects the event-stream scanner; otherwise the body is JSON. Cheap per chunk: SSE chunks without a
    ``"usage"`` key cost one byte search plus keeping the trailing partial line.
    """

    __slots__ = ("sse", "_parts", "_size", "_tail", "_last")

    def __init__(self, sse: bool) -> None:
        self.sse = sse
        self._parts: list[bytes] = []
        self._size = 0
        self._tail = b""
        self._last: bytes | None = None

    def feed(self, chunk: bytes) -> None:
        """Look at the next chunk of the body."""
        if not chunk:
            return
        if not self.sse:
            self._size += len(chunk)
            if self._size <= _MAX_JSON:
                self._parts.append(chunk)
            return
        nl = chunk.rfind(b"\n")
        if nl < 0:
            self._tail = self._tail + chunk if len(self._tail) + len(chunk) <= _MAX_LINE else b""
            return
        complete = self._tail + chunk[:nl] if self._tail else chunk[:nl]
        rest = chunk[nl + 1:]
        self._tail = rest if len(rest) <= _MAX_LINE else b""
        if complete.find(_USAGE) >= 0:
            self._scan(complete)

    def _scan(self, text: bytes) -> None:
        for line in reversed(text.split(b"\n")):
            if line.find(_USAGE) >= 0 and _has_usage_object(line):
                self._last = line
                return

    def usage(self) -> Usage:
        """The usage the body reported, or :data:`NO_USAGE`."""
        if not self.sse:
            body = self._json_body()
            return NO_USAGE if body is None else self._of_body(body)
        if self._tail and self._tail.find(_USAGE) >= 0:
            self._scan(self._tail)
            self._tail = b""
        if self._last is None:
            return NO_USAGE
        return self._of_stream()

    def _json_body(self) -> object | None:
        """The whole (non-SSE) body parsed, when it can hold a usage object; else None."""
        if not self._parts or self._size > _MAX_JSON:
            return None
        body = b"".join(self._parts)
        if body.find(_USAGE) < 0:
            return None
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            return None

    def _of_body(self, body: object) -> Usage:
        return usage_of(body)

    def _of_stream(self) -> Usage:
        """The usage of the last usage-carrying event (``_last`` is set)."""
        event = _event_json(self._last)
        return NO_USAGE if event is None else usage_of(event)


def _event_json(line: bytes | None) -> object:
    """The JSON of one SSE ``data:`` line (None for no line or one that is not JSON)."""
    if line is None:
        return None
    line = line.strip()
    if line.startswith(b"data:"):
        line = line[5:].strip()
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return None


class MessagesUsageReader(UsageReader):
    """:class:`UsageReader` for the Anthropic Messages API: a JSON body is read in the Messages shape; a stream
    keeps its first usage-carrying event too (``message_start``, with the prompt counts) and combines it with the
    last one (``message_delta``, with the completion count), as :func:`epp.usage.messages_stream_usage`."""

    __slots__ = ("_start",)

    def __init__(self, sse: bool) -> None:
        super().__init__(sse)
        self._start: bytes | None = None

    def _scan(self, text: bytes) -> None:
        if self._start is None:
            for line in text.split(b"\n"):
                if line.find(_USAGE) >= 0 and _has_usage_object(line):
                    self._start = line
                    break
        super()._scan(text)

    def _of_body(self, body: object) -> Usage:
        return messages_usage(body)

    def _of_stream(self) -> Usage:
        return messages_stream_usage(_event_json(self._start), _event_json(self._last))


class ModelRestorer:
    """Rewrites the upstream model name back to the client's in a response body, chunk by chunk.

    :meth:`feed` returns the bytes to pass on now (possibly empty: held back) and, with ``end=True``, everything
    that is left. JSON bodies are held to the end (the name may straddle chunks); SSE streams are released up to
    the last complete line.
    """

    __slots__ = ("sse", "_patterns", "_held")

    def __init__(self, target: str, original: str, sse: bool) -> None:
        self.sse = sse
        t, o = orjson.dumps(target), orjson.dumps(original)
        self._patterns = ((b'"model":' + t, b'"model":' + o), (b'"model": ' + t, b'"model": ' + o))
        self._held = b""

    def _rewrite(self, data: bytes) -> bytes:
        for old, new in self._patterns:
            if data.find(old) >= 0:
                data = data.replace(old, new)
        return data

    def feed(self, chunk: bytes, end: bool) -> bytes:
        """Take the next chunk; return what may be sent on now (everything, when ``end``)."""
        data = self._held + chunk if self._held else chunk
        if end:
            self._held = b""
            return self._rewrite(data)
        if not self.sse:
            self._held = data
            return b""
        nl = data.rfind(b"\n")
        self._held = data[nl + 1:]
        return self._rewrite(data[:nl + 1]) if nl >= 0 else b""
