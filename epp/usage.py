"""Token usage as OpenAI-compatible servers report it, shared by both front ends.

Shapes (the reference's ``parsers/openai/openai.go``):

* chat / completions / embeddings: ``usage.{prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens}``
* responses: ``usage.{input_tokens, output_tokens, input_tokens_details.cached_tokens}``, in SSE inside the
  ``response.completed`` event's ``response`` object.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Usage", "NO_USAGE", "usage_of", "usage_dict"]

Usage = tuple[int | None, int | None, int | None]
"""(prompt_tokens, completion_tokens, cached_tokens); None where the response did not say."""

NO_USAGE: Usage = (None, None, None)


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def usage_dict(obj: Any) -> dict[str, Any] | None:
    """The ``usage`` object of a decoded response or SSE event: top level (Chat/Completions) or under
    ``response`` (the Responses API's final event); None if there is none."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        inner = obj.get("response")
        usage = inner.get("usage") if isinstance(inner, dict) else None
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
