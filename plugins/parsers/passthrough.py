"""``passthrough-parser``: does not parse the body; any bytes are accepted and forwarded unchanged.

The request's model comes from the ``x-llm-d-router-model-name-rewrite`` header (or the deprecated
``x-gateway-model-name-rewrite``; else ""); the text used for prefix hashing is the raw body decoded as UTF-8 with
invalid bytes replaced; the API kind comes from the path (completions when unknown); ``max_tokens`` is unknown;
input tokens are the body's bytes / 4, the reference's estimate. Fairness, objective, session and request-id
headers are read as for the OpenAI parser (a value that is not valid UTF-8 is a 400). Header names must already be
lower-case. The body is forwarded unchanged whatever the target model (``model_rewritable`` is False: the
reference's passthrough parser has no ``RewriteModelName``).

YAML::

    plugins:
    - type: passthrough-parser
    requestHandler:
      parsers:
      - pluginRef: passthrough-parser   # the deprecated top-level parser: {pluginRef: passthrough-parser} still works
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.plugins import Handle, NoParams
from epp.framework.request import (
    CHARS_PER_TOKEN,
    DEFAULT_FAIRNESS_ID,
    FAIRNESS_ID_HEADER,
    MODEL_REWRITE_HEADER,
    OBJECTIVE_HEADER,
    REQUEST_ID_HEADER,
    SESSION_HEADER,
    ApiKind,
    InferenceRequest,
    api_kind_for_path,
    header_text,
    new_request_id,
)

__all__ = ["PassthroughParser"]


class PassthroughParser:
    """Builds an :class:`~epp.framework.request.InferenceRequest` from headers and raw bytes without reading the body."""

    type_name: ClassVar[str] = "passthrough-parser"
    claims: ClassVar[tuple[str, ...]] = ()
    """No claimed path: in a ``requestHandler.parsers`` list it takes every path no other parser claims."""
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def parse(self, path: str, body: bytes, headers: dict[str, str]) -> InferenceRequest:
        text = body.decode("utf-8", errors="replace")
        model = header_text(headers, MODEL_REWRITE_HEADER) or ""
        return InferenceRequest(
            request_id=header_text(headers, REQUEST_ID_HEADER) or new_request_id(),
            model=model,
            api=api_kind_for_path(path) or ApiKind.COMPLETIONS,
            body={},
            prompt_text=text,
            input_tokens=max(1, len(body) // CHARS_PER_TOKEN),
            headers=headers,
            fairness_id=header_text(headers, FAIRNESS_ID_HEADER) or DEFAULT_FAIRNESS_ID,
            objective=header_text(headers, OBJECTIVE_HEADER),
            session_token=header_text(headers, SESSION_HEADER),
            body_size=len(body),
            model_rewritable=False,
        )
