"""Token usage as model servers report it: the shapes of a decoded answer or event, and the triple EPP keeps.

Shapes (the reference's ``parsers/openai/openai.go``):

* chat / completions / embeddings: ``usage.{prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens}``
* responses: ``usage.{input_tokens, output_tokens, input_tokens_details.cached_tokens}``, in SSE inside the
  ``response.completed`` event's ``response`` object.
* Anthropic Messages (the reference's ``parsers/anthropic``): ``usage.{input_tokens, output_tokens,
  cache_read_input_tokens, cache_creation_input_tokens}``; the prompt is the sum of the three input counts (they
  are disjoint in Anthropic's API; vLLM reports only ``input_tokens``, the whole prompt), the cached count is
  ``cache_read_input_tokens``. In SSE the prompt comes from ``message_start`` (inside its ``message``) and the
  completion from the last ``message_delta``: :func:`messages_stream_usage`.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Usage", "NO_USAGE", "UsageReading", "usage_of", "usage_dict", "messages_usage", "messages_stream_usage"]

Usage = tuple[int | None, int | None, int | None]
"""(prompt_tokens, completion_tokens, cached_tokens); None where the response did not say."""

NO_USAGE: Usage = (None, None, None)


class UsageReading(Protocol):
    """Reads a response's usage as its body streams past: :meth:`feed` gets every body chunk in order (never
    raising on malformed input), :meth:`usage` is asked once after the last one. The front ends' own readers have
    this shape, and so does what a parser's ``usage_reader(request, sse)`` returns for a response format of its
    own (gRPC frames, SGLang's ``meta_info``)."""

    def feed(self, chunk: bytes) -> None: ...

    def usage(self) -> Usage: ...


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def usage_dict(obj: Any, inner: str = "response") -> dict[str, Any] | None:
    """The ``usage`` object of a decoded response or SSE event: top level (Chat/Completions) or under ``inner``
    (``response``: the Responses API's final event; ``message``: a Messages stream's ``message_start``); None if
    there is none."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        nested = obj.get(inner)
        usage = nested.get("usage") if isinstance(nested, dict) else None
    return usage if isinstance(usage, dict) else None


def usage_of(obj: Any) -> Usage:
    """The usage triple of one decoded response object or SSE event; :data:`NO_USAGE` if it has none."""
    usage = usage_dict(obj)
    if usage is None:
        return NO_USAGE
    if "input_tokens" in usage or "output_tokens" in usage:
        details = usage.get("input_tokens_details")
        return (_int(usage.get("input_tokens")), _int(usage.get("output_tokens")),
                _int(details.get("cached_tokens")) if isinstance(details, dict) else None)
    details = usage.get("prompt_tokens_details")
    return (_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")),
            _int(details.get("cached_tokens")) if isinstance(details, dict) else None)


def messages_usage(obj: Any) -> Usage:
    """The usage triple of an Anthropic Messages response or SSE event (``usage`` at the top, as in a response
    and ``message_delta``, or inside ``message``, as in ``message_start``); :data:`NO_USAGE` if it has none."""
    usage = usage_dict(obj, "message")
    if usage is None:
        return NO_USAGE
    fresh, read = _int(usage.get("input_tokens")), _int(usage.get("cache_read_input_tokens"))
    created = _int(usage.get("cache_creation_input_tokens"))
    prompt = None if fresh is None and read is None and created is None else (fresh or 0) + (read or 0) + (created or 0)
    return prompt, _int(usage.get("output_tokens")), read


def messages_stream_usage(start: Any, last: Any) -> Usage:
    """A Messages stream's usage from its ``message_start`` event (``start``: prompt and cached counts) and its
    last usage-carrying event (``last``, normally the final ``message_delta``: the completion count), as the
    reference reads them; a count ``start`` lacks is taken from ``last``. Either may be None (not seen)."""
    first, final = messages_usage(start), messages_usage(last)
    return (first[0] if first[0] is not None else final[0], final[1] if final[1] is not None else first[1],
            first[2] if first[2] is not None else final[2])
