"""``anthropic-parser``: the Anthropic Messages API only (``openai-parser`` parses ``/v1/messages`` too, with the same
code).

The path decides: ``.../messages`` is parsed exactly as ``openai-parser`` parses ``/v1/messages``
(:func:`epp.framework.request.parse_request`); ``messages/count_tokens`` and ``messages/render`` read only the
envelope (no prompt to hash); anything else is a 400 ``unsupported API endpoint: <path>``. The body's ``model`` is
rewritten to the target model when they differ. Errors are ``BadRequest`` (400) in Anthropic's error envelope.

YAML::

    plugins:
    - type: anthropic-parser
    requestHandler:
      parsers:
      - pluginRef: anthropic-parser   # the deprecated top-level parser: {pluginRef: anthropic-parser} still works
"""

from __future__ import annotations

from typing import ClassVar, Mapping

import orjson

from epp.errors import BodyNotObject, InvalidJson, InvalidShape, MissingModel
from epp.framework.plugins import Handle, NoParams
from epp.framework.request import ApiKind, InferenceRequest, parse_request

from ._wire import headers_request, request_path

__all__ = ["AnthropicParser"]


class AnthropicParser:
    """``parse(path, body, headers)``: an Anthropic Messages, count-tokens or render request (see the module
    doc), or a ``BadRequest``."""

    type_name: ClassVar[str] = "anthropic-parser"
    claims: ClassVar[tuple[str, ...]] = ("messages", "messages/count_tokens", "messages/render")
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def parse(self, path: str, body: bytes, headers: dict[str, str]) -> InferenceRequest:
        route = request_path(path, headers).strip().removesuffix("/")
        if route.endswith("messages/render"):
            return _envelope(body, headers, require_model=False)
        if route.endswith("messages/count_tokens"):
            return _envelope(body, headers, require_model=True)
        if route.endswith("messages"):
            return parse_request(path, body, headers, default_kind=ApiKind.MESSAGES)
        raise InvalidShape(f"unsupported API endpoint: {route}")


def _envelope(body: bytes, headers: Mapping[str, str], *, require_model: bool) -> InferenceRequest:
    """A count-tokens or render request: the JSON object and its model, nothing to hash."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJson(f"error unmarshaling request body: {exc}") from None
    if not isinstance(data, dict):
        raise BodyNotObject("error unmarshaling request body: the body must be a JSON object")
    model = data.get("model")
    if not isinstance(model, str):
        model = ""
    if require_model and not model:
        raise MissingModel("invalid count_tokens request: must have a model", param="model")
    limit = data.get("max_tokens") if require_model else None
    max_tokens = None
    if isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit >= 0 and limit == int(limit):
        max_tokens = int(limit)
    return headers_request(headers, len(body), api=ApiKind.MESSAGES, body=data, prompt_text="", input_tokens=1,
                           model=model, max_tokens=max_tokens)
