"""Token usage from OpenAI responses (JSON bodies and SSE streams), and the rewrites P/D needs.

Reading is built for the hot path: :class:`SseUsageTracker` looks at each chunk with a C-level byte search and
keeps only the raw text of the last event carrying a ``"usage"`` object; it parses that one event once, when the
stream ends. Byte searches are written ``data.find(key) >= 0``, not ``key in data``: on CPython 3.11 ``in`` on
bytes first tries the key as an integer and builds and drops a TypeError every time (twice the cost; callgrind
showed it as 5 % of a streamed request). Shapes understood (the reference's ``parsers/openai/openai.go``):

* chat / completions / embeddings: ``usage.{prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens}``
* responses: ``usage.{input_tokens, output_tokens, input_tokens_details.cached_tokens}``, in SSE inside the
  ``response.completed`` event's ``response`` object.
* Anthropic Messages: :func:`messages_usage_from_body` and :class:`MessagesSseUsageTracker` (the prompt from
  ``message_start``, the completion from the last ``message_delta``; see :mod:`epp.usage`).
"""

from __future__ import annotations

from typing import Any

import orjson

from epp.usage import NO_USAGE, Usage, messages_stream_usage, messages_usage, usage_dict
from epp.usage import usage_of as usage_from_json

__all__ = ["Usage", "usage_from_json", "usage_from_body", "messages_usage_from_body", "SseUsageTracker",
           "MessagesSseUsageTracker", "SseLineRewriter", "rewrite_json_body", "set_cached_tokens"]

_USAGE_KEY = b'"usage"'
_MAX_TAIL = 1 << 20  # an SSE line longer than 1 MiB is not tracked (nothing real is that long)


def usage_from_body(body: bytes) -> Usage:
    """Usage of a complete JSON response body; ``NO_USAGE`` if it is not JSON or has none."""
    if body.find(_USAGE_KEY) < 0:
        return NO_USAGE
    try:
        return usage_from_json(orjson.loads(body))
    except orjson.JSONDecodeError:
        return NO_USAGE


def messages_usage_from_body(body: bytes) -> Usage:
    """Usage of a complete Anthropic Messages JSON response body; ``NO_USAGE`` if it is not JSON or has none."""
    if body.find(_USAGE_KEY) < 0:
        return NO_USAGE
    try:
        return messages_usage(orjson.loads(body))
    except orjson.JSONDecodeError:
        return NO_USAGE


def _usage_object_at(buf: bytes, key_at: int) -> bool:
    """Whether the ``"usage"`` key at ``key_at`` has an object value (``"usage":null`` does not count)."""
    i = key_at + len(_USAGE_KEY)
    n = len(buf)
    while i < n and buf[i] in b" \t:":
        i += 1
    return i < n and buf[i] == 0x7B  # '{'


def _last_usage_line(buf: bytes, end: int | None = None) -> bytes | None:
    """The last line of ``buf[:end]`` whose ``"usage"`` key holds an object, or None."""
    limit = len(buf) if end is None else end
    stop_at = limit
    while True:
        at = buf.rfind(_USAGE_KEY, 0, stop_at)
        if at < 0:
            return None
        if _usage_object_at(buf, at):
            start = buf.rfind(b"\n", 0, at) + 1
            stop = buf.find(b"\n", at, limit)
            return buf[start:stop if stop >= 0 else limit]
        stop_at = at


def _first_usage_line(buf: bytes, end: int) -> bytes | None:
    """The first line of ``buf[:end]`` whose ``"usage"`` key holds an object, or None."""
    at = buf.find(_USAGE_KEY, 0, end)
    while at >= 0:
        if _usage_object_at(buf, at):
            start = buf.rfind(b"\n", 0, at) + 1
            stop = buf.find(b"\n", at, end)
            return buf[start:stop if stop >= 0 else end]
        at = buf.find(_USAGE_KEY, at + len(_USAGE_KEY), end)
    return None


def _event_json(line: bytes) -> Any:
    line = line.strip()
    if line.startswith(b"data:"):
        line = line[5:].strip()
    if not line or line == b"[DONE]":
        return None
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return None


class SseUsageTracker:
    """Feeds on SSE chunks as they pass through and yields the stream's final usage.

    Contract: call :meth:`feed` with every chunk in order, then :meth:`usage` once. Lines split across chunks
    are joined. The *last* event with a usage object wins (with ``continuous_usage_stats`` every event carries
    cumulative usage; otherwise only the final one does).
    """

    __slots__ = ("_tail", "_last")

    def __init__(self) -> None:
        self._tail = b""
        self._last: bytes | None = None

    def feed(self, chunk: bytes) -> None:
        """Look at one chunk (cheap when it has no complete ``"usage"`` line)."""
        if not self._tail and chunk[-1:] == b"\n":  # whole lines, nothing carried over: SSE's usual chunk
            if chunk.find(_USAGE_KEY) >= 0:
                self._remember(chunk, len(chunk))
            return
        nl = chunk.rfind(b"\n")
        if nl < 0:
            if len(self._tail) + len(chunk) <= _MAX_TAIL:
                self._tail += chunk
            else:
                self._tail = b""
            return
        if self._tail:  # a line was split across chunks: join it
            complete = self._tail + chunk[:nl]
            end = len(complete)
        else:  # a partial last line: search the complete ones in place, no copy
            complete, end = chunk, nl
        self._tail = chunk[nl + 1:]
        if complete.find(_USAGE_KEY, 0, end) >= 0:
            self._remember(complete, end)

    def feed_chunk(self, read: bytes, start: int) -> None:
        """:meth:`feed` for a read that is exactly one whole HTTP chunk (payload ``read[start:-2]``). The usual
        chunk, whole lines without ``"usage"`` (which the framing around it cannot hold), is skipped without
        copying the payload; any other is fed."""
        if not self._tail and read[-3] == 0x0A and read.find(_USAGE_KEY) < 0:
            return
        self.feed(read[start:-2])

    def usage(self) -> Usage:
        """The usage of the last usage-carrying event seen (a trailing line without newline included)."""
        if self._tail and self._tail.find(_USAGE_KEY) >= 0:
            self._remember(self._tail, len(self._tail))
            self._tail = b""
        return usage_from_json(_event_json(self._last)) if self._last is not None else NO_USAGE

    def _remember(self, buf: bytes, end: int) -> None:
        """Keep the last usage-carrying line of ``buf[:end]``, if any."""
        line = _last_usage_line(buf, end)
        if line is not None:
            self._last = line


class MessagesSseUsageTracker(SseUsageTracker):
    """:class:`SseUsageTracker` for an Anthropic Messages stream: it also keeps the first usage-carrying event
    (``message_start``, whose ``message.usage`` has the prompt counts), and :meth:`usage` combines the two as
    :func:`epp.usage.messages_stream_usage`. Same contract as its base."""

    __slots__ = ("_start",)

    def __init__(self) -> None:
        super().__init__()
        self._start: bytes | None = None

    def usage(self) -> Usage:
        if self._tail and self._tail.find(_USAGE_KEY) >= 0:
            self._remember(self._tail, len(self._tail))
            self._tail = b""
        if self._last is None:
            return NO_USAGE
        return messages_stream_usage(_event_json(self._start) if self._start is not None else None,
                                     _event_json(self._last))

    def _remember(self, buf: bytes, end: int) -> None:
        if self._start is None:
            self._start = _first_usage_line(buf, end)
        super()._remember(buf, end)


def set_cached_tokens(obj: Any, cached: int) -> bool:
    """Set the usage's cached-token count in a response object or SSE event (in place); True if changed."""
    usage = usage_dict(obj)
    if usage is None:
        return False
    key = "input_tokens_details" if "input_tokens" in usage else "prompt_tokens_details"
    details = usage.get(key)
    if isinstance(details, dict):
        details["cached_tokens"] = cached
    else:
        usage[key] = {"cached_tokens": cached}
    return True


def _rewrite_obj(obj: Any, model: str | None, cached: int | None, inner_key: str = "response") -> bool:
    """Restore ``model`` at the top of ``obj`` and in its ``inner_key`` object (the Responses API's final event
    carries a ``response``, the Messages API's ``message_start`` a ``message``); set ``cached``."""
    changed = False
    if model is not None and isinstance(obj, dict):
        if isinstance(obj.get("model"), str):
            obj["model"] = model
            changed = True
        inner = obj.get(inner_key)
        if isinstance(inner, dict) and isinstance(inner.get("model"), str):
            inner["model"] = model
            changed = True
    if cached is not None:
        changed = set_cached_tokens(obj, cached) or changed
    return changed


def rewrite_json_body(body: bytes, *, model: str | None, cached: int | None) -> bytes:
    """A JSON response body with ``model`` restored and/or usage ``cached_tokens`` set; unchanged if not JSON."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    return orjson.dumps(obj) if _rewrite_obj(obj, model, cached) else body


class SseLineRewriter:
    """Rewrites ``data:`` events of an SSE stream line by line (model name back, prefiller's cached_tokens).

    Used only when a rewrite is needed; the plain pass-through path never splits chunks. :meth:`feed` returns
    every complete line (rewritten) and keeps a partial last line for the next chunk; :meth:`flush` returns
    what is left at the end of the stream. SSE events end with a blank line, so nothing is held back in practice.
    ``inner_key`` names the nested object whose ``model`` is restored too: ``response`` (the Responses API) or
    ``message`` (the Messages API's ``message_start``).
    """

    __slots__ = ("_tail", "_model", "_cached", "_model_key", "_inner_key")

    def __init__(self, *, model: str | None, cached: int | None, inner_key: str = "response") -> None:
        self._tail = b""
        self._model = model
        self._cached = cached
        self._model_key = b'"model"'
        self._inner_key = inner_key

    def feed(self, chunk: bytes) -> bytes:
        """The rewritten complete lines of ``chunk`` (plus any earlier partial line)."""
        data = self._tail + chunk if self._tail else chunk
        nl = data.rfind(b"\n")
        if nl < 0:
            self._tail = data
            return b""
        self._tail = data[nl + 1:]
        return self._rewrite(data[:nl + 1])

    def flush(self) -> bytes:
        """Whatever partial line is left at the end of the stream (rewritten)."""
        rest, self._tail = self._tail, b""
        return self._rewrite(rest) if rest else b""

    def _rewrite(self, block: bytes) -> bytes:
        if not self._wants(block):
            return block
        lines = block.split(b"\n")
        for i, line in enumerate(lines):
            if line.startswith(b"data:") and self._wants(line):
                obj = _event_json(line)
                if obj is not None and _rewrite_obj(obj, self._model, self._cached, self._inner_key):
                    lines[i] = b"data: " + orjson.dumps(obj) + (b"\r" if line.endswith(b"\r") else b"")
        return b"\n".join(lines)

    def _wants(self, data: bytes) -> bool:
        return (self._cached is not None and data.find(_USAGE_KEY) >= 0) or (
            self._model is not None and data.find(self._model_key) >= 0)
