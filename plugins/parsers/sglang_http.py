"""``sglanghttp-parser``: SGLang's native HTTP ``/generate`` API with pre-tokenized prompts.

Only the path ``/generate`` is accepted (any other is a 400 ``unsupported path``). ``input_ids`` (required, a
non-empty array of uint32) are the request's ``token_ids``; ``extra_key`` is the cache salt,
``sampling_params.max_new_tokens`` the output limit, ``stream`` the stream flag. The body names no model: the
model is the ``x-llm-d-router-model-name-rewrite`` header (else ""), and the body is forwarded unchanged.
:meth:`SGLangHTTPParser.usage_reader` reads SGLang's ``meta_info`` usage. Reached through ext_proc only.

YAML::

    plugins:
    - type: sglanghttp-parser
    requestHandler:
      parsers:
      - pluginRef: sglanghttp-parser   # the deprecated top-level parser: {pluginRef: sglanghttp-parser} still works
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import orjson

from epp.errors import InvalidJson, InvalidShape
from epp.framework.plugins import Handle, NoParams
from epp.framework.request import ApiKind, InferenceRequest
from epp.usage import NO_USAGE, Usage

from ._wire import headers_request, request_path, token_prompt

__all__ = ["SGLangHTTPParser", "SglangMetaInfoReader"]

_UINT32_MAX = (1 << 32) - 1
_MAX_JSON = 8 << 20  # a non-streamed reply above this is not parsed for usage
_MAX_LINE = 1 << 20  # an SSE line above this is not tracked


class SGLangHTTPParser:
    """``parse(path, body, headers)``: an SGLang ``/generate`` request with ``input_ids`` (see the module doc),
    or a ``BadRequest``; ``usage_reader`` reads SGLang's ``meta_info`` usage."""

    type_name: ClassVar[str] = "sglanghttp-parser"
    claims: ClassVar[tuple[str, ...]] = ("generate",)
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def parse(self, path: str, body: bytes, headers: dict[str, str]) -> InferenceRequest:
        route = request_path(path, headers).strip().removesuffix("/")
        if route not in ("generate", "/generate"):
            raise InvalidShape(f"unsupported path: {route}")
        return _generate(body, headers)

    def usage_reader(self, request: InferenceRequest, sse: bool) -> SglangMetaInfoReader:
        """A reader of the ``meta_info`` usage of this request's response (``sse``: an event stream)."""
        return SglangMetaInfoReader(sse)


def _generate(body: bytes, headers: Mapping[str, str]) -> InferenceRequest:
    data = _object(body)
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidShape("invalid generate request: 'stream' must be a boolean", param="stream")
    if data.get("input_ids") is None:
        raise InvalidShape("invalid generate request: input_ids must be provided", param="input_ids")
    salt = data.get("extra_key")
    if salt is not None and not isinstance(salt, str):
        raise InvalidShape("unsupported generate request: extra_key must be a string", param="extra_key")
    ids = _input_ids(data["input_ids"])
    prompt, tokens = token_prompt(ids)
    return headers_request(headers, len(body), api=ApiKind.COMPLETIONS, body=data, prompt_text=prompt,
                           input_tokens=tokens, token_ids=ids, max_tokens=_max_new_tokens(data.get("sampling_params")),
                           stream=stream is True, cache_salt=salt or None, model_rewritable=False)


def _object(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJson(f"invalid generate request: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidShape("invalid generate request: the body must be a JSON object")
    return data


def _input_ids(value: Any) -> list[int]:
    """``input_ids`` as Go decodes a ``[]uint32`` (a JSON null element is 0 there, and here)."""
    if not isinstance(value, list) or not all(
            v is None or (type(v) is int and 0 <= v <= _UINT32_MAX) for v in value):
        raise InvalidShape("invalid generate request: input_ids must be an array of uint32 integers",
                           param="input_ids")
    if not value:
        raise InvalidShape("invalid generate request: input_ids cannot be empty", param="input_ids")
    return [v or 0 for v in value]


def _max_new_tokens(params: Any) -> int | None:
    value = params.get("max_new_tokens") if isinstance(params, dict) else None
    return value if type(value) is int and value >= 0 else None


class SglangMetaInfoReader:
    """Usage from an SGLang ``/generate`` reply: a JSON body's ``meta_info``, or the first finished event of an
    SSE stream (``data: `` lines; ``[DONE]`` and unparsable lines skipped). Counts must be JSON integers (else no
    usage); with one count present the other is 0, as in the reference."""

    __slots__ = ("sse", "_parts", "_size", "_tail", "_usage", "_done")

    def __init__(self, sse: bool) -> None:
        self.sse = sse
        self._parts: list[bytes] = []
        self._size = 0
        self._tail = b""
        self._usage: Usage = NO_USAGE
        self._done = False

    def feed(self, chunk: bytes) -> None:
        if not self.sse:
            self._size += len(chunk)
            if self._size <= _MAX_JSON:
                self._parts.append(chunk)
            return
        if self._done or not chunk:
            return
        data = self._tail + chunk
        nl = data.rfind(b"\n")
        self._tail = data[nl + 1:] if len(data) - nl - 1 <= _MAX_LINE else b""
        if nl >= 0:
            self._scan(data[:nl])

    def usage(self) -> Usage:
        if not self.sse:
            if self._size > _MAX_JSON or not self._parts:
                return NO_USAGE
            try:
                return _meta_usage(orjson.loads(b"".join(self._parts))) or NO_USAGE
            except orjson.JSONDecodeError:
                return NO_USAGE
        if self._tail and not self._done:
            self._scan(self._tail)
        return self._usage

    def _scan(self, text: bytes) -> None:
        for line in text.split(b"\n"):
            event = _event(line)
            if event is None:
                continue
            meta = event.get("meta_info")
            if isinstance(meta, dict) and meta.get("finish_reason") is not None:
                self._usage = _meta_usage(event) or NO_USAGE
                self._done = True
                return


def _event(line: bytes) -> dict[str, Any] | None:
    """The JSON object of one ``data: `` SSE line (None for other lines, ``[DONE]`` and bad JSON)."""
    line = line.strip()
    if not line.startswith(b"data: "):
        return None
    data = line[6:].strip()
    if data == b"[DONE]":
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _meta_usage(obj: Any) -> Usage | None:
    """``(prompt, completion, cached)`` from ``meta_info``; None when it has neither count or one is not an
    integer (the reference's decoding error)."""
    meta = obj.get("meta_info") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None
    counts = [meta.get(k) for k in ("prompt_tokens", "completion_tokens", "cached_tokens")]
    if any(c is not None and type(c) is not int for c in counts):
        return None
    prompt, completion, cached = counts
    if prompt is None and completion is None:
        return None
    return prompt or 0, completion or 0, cached

