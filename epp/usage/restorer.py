"""Restoring in an answer what EPP changed in the request, as the answer streams back: one restorer for both front
ends.

:class:`ResponseRestorer` gives the client its own model name back after a model rewrite and, after a P/D
prefill, sets the prefiller's cached-token count in the usage. :meth:`~ResponseRestorer.feed` returns what may be
sent on now: an event stream is released up to its last complete line, a JSON body is held to its end (a name may
straddle chunks). A released block is rewritten in one of two ways:

* the ``target`` (the name the model server got) is known: every ``"model": "<target>"`` pair gets the client's
  name in place, and no other byte changes;
* otherwise, each ``data:`` line (or the JSON body) naming a model or, with ``cached``, carrying a usage is parsed,
  ``model`` restored at its top level and in its ``inner_key`` object (the Responses API's ``response``, a
  Messages stream's ``message``), the cached count set, and the line serialized again.

Text that is not JSON passes unchanged.
"""

from __future__ import annotations

from typing import Any

import orjson

from epp.usage.reader import event_json
from epp.usage.shapes import usage_dict

__all__ = ["ResponseRestorer", "restore_body"]

_USAGE_KEY = b'"usage"'
_MODEL_KEY = b'"model"'


def restore_body(body: bytes, *, model: str | None, cached: int | None, inner_key: str = "response") -> bytes:
    """A complete JSON answer with ``model`` restored (top level and ``inner_key``) and/or the usage's
    ``cached_tokens`` set; unchanged when it is not JSON or nothing changed."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    return orjson.dumps(obj) if _restore(obj, model, cached, inner_key) else body


class ResponseRestorer:
    """Rewrites one answer's body chunk by chunk (see the module docstring for what and how).

    ``target`` and ``model``: the name the model server got and the client's; ``sse``: the body is an event
    stream, else one JSON document; ``cached``: the cached-token count to set (None: left alone). :meth:`feed`
    returns the bytes to pass on now (possibly none: held back) and, with ``end``, everything that is left.
    """

    __slots__ = ("sse", "_names", "_model", "_cached", "_inner_key", "_held")

    def __init__(self, target: str | None = None, model: str | None = None, sse: bool = True, *,
                 cached: int | None = None, inner_key: str = "response") -> None:
        self.sse = sse
        self._names: tuple[tuple[bytes, bytes], ...] = ()
        if target is not None and model is not None:
            t, o = orjson.dumps(target), orjson.dumps(model)
            self._names = ((b'"model":' + t, b'"model":' + o), (b'"model": ' + t, b'"model": ' + o))
            model = None  # restored in place: no line needs parsing for it
        self._model = model
        self._cached = cached
        self._inner_key = inner_key
        self._held = b""

    def feed(self, chunk: bytes, end: bool = False) -> bytes:
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

    def flush(self) -> bytes:
        """What is left at the end of the body (rewritten): :meth:`feed` of nothing with ``end``."""
        return self.feed(b"", True)

    def _rewrite(self, block: bytes) -> bytes:
        for old, new in self._names:
            if block.find(old) >= 0:
                block = block.replace(old, new)
        if not self._wants(block):
            return block
        if not self.sse:
            return restore_body(block, model=self._model, cached=self._cached, inner_key=self._inner_key)
        lines = block.split(b"\n")
        for i, line in enumerate(lines):
            if line.startswith(b"data:") and self._wants(line):
                obj = event_json(line)
                if obj is not None and _restore(obj, self._model, self._cached, self._inner_key):
                    lines[i] = b"data: " + orjson.dumps(obj) + (b"\r" if line.endswith(b"\r") else b"")
        return b"\n".join(lines)

    def _wants(self, data: bytes) -> bool:
        """Whether ``data`` may hold something to parse and rewrite."""
        return (self._cached is not None and data.find(_USAGE_KEY) >= 0) or (
            self._model is not None and data.find(_MODEL_KEY) >= 0)




def _restore(obj: Any, model: str | None, cached: int | None, inner_key: str) -> bool:
    """Restore ``model`` at the top of ``obj`` and in its ``inner_key`` object; set ``cached``. True if changed."""
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
        changed = _set_cached_tokens(obj, cached) or changed
    return changed


def _set_cached_tokens(obj: Any, cached: int) -> bool:
    """Set the usage's cached-token count in an answer or SSE event (in place); True if it has a usage."""
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
