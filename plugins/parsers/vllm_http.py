"""``vllmhttp-parser``: vLLM's HTTP endpoints beyond the OpenAI API, currently ``/inference/v1/generate`` (the
disaggregated prefill/decode API, pre-tokenized), with every other path parsed by ``openai-parser``.

A generate body is a JSON object: ``token_ids`` (required, not empty, each in [0, 2^32-1]) are the request's
``token_ids``; ``cache_salt``, ``features`` (multimodal hashes), ``sampling_params.max_tokens``, ``stream`` and
``model`` (else the ``x-llm-d-router-model-name-rewrite`` header's) are read when present. Only a body that names its
model has it rewritten. Errors are ``BadRequest`` (400). Reached through ext_proc only.

YAML::

    plugins:
    - type: vllmhttp-parser
    requestHandler:
      parsers:
      - pluginRef: vllmhttp-parser   # the deprecated top-level parser: {pluginRef: vllmhttp-parser} still works
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import orjson

from epp.errors import InvalidJson, InvalidShape
from epp.framework.plugins import Handle, NoParams
from epp.framework.request import ApiKind, InferenceRequest, parse_request
from epp.kvcache import parse_mm_features

from ._wire import headers_request, request_path, token_prompt

__all__ = ["VllmHTTPParser", "GENERATE_SUFFIX"]

GENERATE_SUFFIX = "inference/v1/generate"
_UINT32_MAX = (1 << 32) - 1


class VllmHTTPParser:
    """``parse(path, body, headers)``: a vLLM ``/inference/v1/generate`` request (see the module doc), any other
    path as ``openai-parser``; a ``BadRequest`` for bad input."""

    type_name: ClassVar[str] = "vllmhttp-parser"
    claims: ClassVar[tuple[str, ...]] = (GENERATE_SUFFIX,)
    """Only ``inference/v1/generate``: in a ``requestHandler.parsers`` list the OpenAI paths go to the parser
    that claims them (alone, it parses them too, as the module doc says)."""
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def parse(self, path: str, body: bytes, headers: dict[str, str]) -> InferenceRequest:
        if request_path(path, headers).strip().removesuffix("/").endswith(GENERATE_SUFFIX):
            return _generate(body, headers)
        return parse_request(path, body, headers)


def _generate(body: bytes, headers: Mapping[str, str]) -> InferenceRequest:
    data = _object(body)
    ids = _token_ids(data.get("token_ids"))
    salt = data.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise InvalidShape("invalid generate request: 'cache_salt' must be a string", param="cache_salt")
    features = data.get("features")
    _check_features(features)
    if not ids:
        raise InvalidShape("invalid generate request: must have non-empty token_ids field", param="token_ids")
    model = data.get("model")
    named = isinstance(model, str)
    prompt, tokens = token_prompt(ids)
    return headers_request(
        headers, len(body), api=ApiKind.COMPLETIONS, body=data, prompt_text=prompt, input_tokens=tokens,
        token_ids=ids, model=model if named else "", max_tokens=_max_tokens(data.get("sampling_params")),
        stream=data.get("stream") is True, cache_salt=salt or None, model_rewritable=named,
        mm_features=parse_mm_features(features))


def _object(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJson(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidShape("invalid generate request: the body must be a JSON object")
    return data


def _token_ids(value: Any) -> list[int]:
    """``token_ids`` as the reference decodes them: numbers (a JSON null is 0), each a whole number in
    [0, 2^32-1]; absent is empty (refused by the caller once the other fields are checked, as the reference
    checks emptiness after decoding)."""
    if value is None:
        value = []
    if not isinstance(value, list):
        raise InvalidShape("invalid generate request: 'token_ids' must be an array of numbers", param="token_ids")
    ids = []
    for i, v in enumerate(value):
        if v is None:
            v = 0
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidShape("invalid generate request: 'token_ids' must be an array of numbers",
                               param="token_ids")
        if v < 0 or v > _UINT32_MAX or v != int(v):
            raise InvalidShape(f"invalid generate request: token_ids[{i}]: invalid value {v}", param="token_ids")
        ids.append(int(v))
    return ids


def _check_features(features: Any) -> None:
    """``features`` must be null or ``{mm_hashes: {modality: [str]}, mm_placeholders: {modality: [{offset: int,
    length: int}]}}`` (each part optional), the shape the reference decodes."""
    if features is None:
        return
    ok = isinstance(features, dict) and _map_of_lists(features.get("mm_hashes"), lambda h: isinstance(h, str)) \
        and _map_of_lists(features.get("mm_placeholders"), _placeholder)
    if not ok:
        raise InvalidShape("invalid generate request: malformed 'features'", param="features")


def _map_of_lists(value: Any, item_ok: Any) -> bool:
    if value is None:
        return True
    return isinstance(value, dict) and all(
        v is None or (isinstance(v, list) and all(item is None or item_ok(item) for item in v))
        for v in value.values())


def _placeholder(item: Any) -> bool:
    return isinstance(item, dict) and all(
        item.get(k) is None or (type(item.get(k)) is int) for k in ("offset", "length"))


def _max_tokens(params: Any) -> int | None:
    value = params.get("max_tokens") if isinstance(params, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
        return None
    return int(value)
