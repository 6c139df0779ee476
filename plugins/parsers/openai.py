"""``openai-parser`` (the default parser): OpenAI API bodies, read by :func:`epp.framework.request.parse_request`.

Completions, chat completions, responses and embeddings; the path decides the API. It also parses the Anthropic
Messages API (``/v1/messages``), which the reference does with its ``anthropic-parser`` (one of its default
parsers when a config names none). Errors are the typed
``BadRequest`` subclasses (HTTP 400): not JSON, not an object, missing/non-string ``model``, wrong shape for the
path. Header names must already be lower-case.

YAML::

    plugins:
    - type: openai-parser
    requestHandler:
      parsers:
      - pluginRef: openai-parser   # the deprecated top-level parser: {pluginRef: openai-parser} still works
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.plugins import Handle, NoParams
from epp.framework.request import InferenceRequest, parse_request

__all__ = ["OpenAIParser"]


class OpenAIParser:
    """``parse(path, body, headers)`` -> :class:`~epp.framework.request.InferenceRequest`, or a ``BadRequest``."""

    type_name: ClassVar[str] = "openai-parser"
    claims: ClassVar[tuple[str, ...]] = (
        "chat/completions", "completions", "embeddings", "responses", "conversations", "chat/completions/render",
        "completions/render", "images/generations", "images/edits", "audio/speech", "videos", "videos/sync")
    """The path suffixes it is chosen for in a ``requestHandler.parsers`` list (the reference's claims; not
    ``messages``, which a list gives to ``anthropic-parser``)."""
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def parse(self, path: str, body: bytes, headers: dict[str, str]) -> InferenceRequest:
        return parse_request(path, body, headers)
