"""The request model: what the scheduler knows about one OpenAI-style (or Anthropic Messages) request.

``parse_request`` is plugin-free: it turns (path, body bytes, headers) into an :class:`InferenceRequest` or raises a
specific :class:`~epp.errors.BadRequest` subclass. Both front ends (ext_proc and the HTTP gateway) call it.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Mapping

import orjson

from epp.errors import BodyNotObject, InvalidJson, InvalidShape, MissingModel
from epp.headers import (
    FAIRNESS_ID_HEADER,
    HEADER_ALIASES,
    MODEL_REWRITE_HEADER,
    OBJECTIVE_HEADER,
    REQUEST_ID_HEADER,
    SESSION_HEADER,
)

__all__ = [
    "ApiKind", "InferenceRequest", "MultiModalFeature", "parse_request", "new_request_id", "api_kind_for_path",
    "is_messages_path", "has_media", "MEDIA_PART_TYPES", "request_headers_view",
    "FAIRNESS_ID_HEADER", "OBJECTIVE_HEADER", "MODEL_REWRITE_HEADER", "SESSION_HEADER", "REQUEST_ID_HEADER",
    "DEFAULT_FAIRNESS_ID", "CHARS_PER_TOKEN", "DEFAULT_BODY_LIMIT", "utf8_len", "header_text",
]

DEFAULT_FAIRNESS_ID = "default-flow"
CHARS_PER_TOKEN = 4  # the reference's estimate: tokens = bytes / 4 until a tokenizer is configured
DEFAULT_BODY_LIMIT = 10 * 1024 * 1024  # request bodies above this get 413 before parsing (both front ends)


class ApiKind(StrEnum):
    """Which API a request is for (OpenAI's, or Anthropic's Messages API); decided by the request path."""

    COMPLETIONS = "completions"
    CHAT_COMPLETIONS = "chat_completions"
    RESPONSES = "responses"
    EMBEDDINGS = "embeddings"
    MESSAGES = "messages"


_PATH_KINDS: tuple[tuple[str, ApiKind], ...] = (
    ("/chat/completions", ApiKind.CHAT_COMPLETIONS),
    ("/completions", ApiKind.COMPLETIONS),
    ("/responses", ApiKind.RESPONSES),
    ("/embeddings", ApiKind.EMBEDDINGS),
    ("/messages", ApiKind.MESSAGES),  # last: the OpenAI paths match before it
)
_MESSAGES = ApiKind.MESSAGES


@dataclass(frozen=True, slots=True)
class MultiModalFeature:
    """One image, audio or video item of a rendered prompt (vLLM's render ``features``): its modality, its hash (what
    vLLM keys the item's blocks by) and the range of placeholder tokens standing for it in the prompt's ids."""

    modality: str
    hash: str
    offset: int
    length: int


@dataclass(slots=True)
class InferenceRequest:
    """One request as the scheduler sees it.

    ``prompt_text`` is the text hashed for prefix-cache affinity (chat: serialized ``messages``; completions: the
    prompt; responses: instructions + tools + input; embeddings: the input; messages: the system text, the
    serialized ``tools``, then each message's role and text, as the reference flattens a Messages request; a
    pre-tokenized prompt, from a gRPC or ``generate`` parser: its token ids as JSON text).
    ``input_tokens`` is an estimate (UTF-8 bytes of ``prompt_text`` // 4, at least 1; a pre-tokenized prompt's
    exact length). ``target_model`` starts equal to ``model`` and may be rewritten.
    """

    request_id: str
    model: str
    api: ApiKind
    body: dict[str, Any]
    prompt_text: str
    input_tokens: int
    max_tokens: int | None = None
    stream: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    fairness_id: str = DEFAULT_FAIRNESS_ID
    objective: str | None = None
    priority: int = 0
    session_token: str | None = None
    cache_salt: str | None = None
    target_model: str = ""
    lora_adapter: str | None = None
    body_size: int = 0
    token_ids: list[int] | None = None
    """The prompt's token ids, when a ``token-producer`` got them from a tokenizer service or the request itself
    carried them (a pre-tokenized gRPC or ``generate`` request); else None."""
    mm_features: tuple[MultiModalFeature, ...] = ()
    """The multimodal items among ``token_ids``, ordered by offset, when the tokenizer service reported them."""
    model_rewritable: bool = True
    """Whether the forwarded body names the model in a top-level JSON ``"model"`` that a front end may rewrite to
    ``target_model`` (and restore in the response): the reference's ``ModelNameRewriter``. False for bodies that
    are not such JSON (passthrough, gRPC): they must be forwarded unchanged whatever the target model."""

    def __post_init__(self) -> None:
        if not self.target_model:
            self.target_model = self.model

    @property
    def sheddable(self) -> bool:
        """Priority below zero: the reference drops these with 429 when the pool is saturated."""
        return self.priority < 0

    @property
    def estimated_total_tokens(self) -> int:
        """Prompt estimate plus ``max_tokens`` (or 1.5x the prompt when unset): the most the request can occupy
        (KV-capacity filtering, tenant token quotas)."""
        out = self.max_tokens if self.max_tokens is not None else (self.input_tokens * 3) // 2
        return self.input_tokens + out


def api_kind_for_path(path: str) -> ApiKind | None:
    """The API kind for a request path such as ``/v1/chat/completions`` (query string ignored), else None."""
    path = path.split("?", 1)[0].rstrip("/")
    for suffix, kind in _PATH_KINDS:
        if path.endswith(suffix):
            return kind
    return None


def is_messages_path(path: str) -> bool:
    """Whether ``path`` is the Anthropic Messages API's (``/v1/messages``): its answers, errors included, take
    Anthropic's shapes. For error paths only; a parsed request knows its :attr:`InferenceRequest.api`."""
    return api_kind_for_path(path) is ApiKind.MESSAGES


MEDIA_PART_TYPES = frozenset({"image_url", "input_audio", "audio_url", "video_url", "image", "input_image"})
"""Message content part types that carry an image, audio or video (the multimodal parts vLLM's renderer takes)."""


def has_media(messages: Any) -> bool:
    """Whether any message's content (a list of parts) has an image, audio or video part."""
    if not isinstance(messages, list):
        return False
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") in MEDIA_PART_TYPES:
                    return True
    return False


def request_headers_view(headers: Mapping[str, str]) -> dict[str, str]:
    """Lower-case header names (HTTP/2 and Envoy already do; aiohttp's CIMultiDict does not)."""
    return {k.lower(): v for k, v in headers.items()}


def new_request_id() -> str:
    """A random version-4 UUID string for a request without ``x-request-id``.

    Drawn from :mod:`random` rather than ``uuid.uuid4()``: ids need to be unique, not unpredictable, and
    ``uuid4`` costs a ``getrandom()`` system call per request. ``random`` reseeds itself in forked workers, so
    ``--workers`` processes draw different ids. Formatted directly (version and variant bits set by mask), which
    costs a third of building a ``uuid.UUID``.
    """
    h = "%032x" % (random.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)
"""Version 4 (bits 76–79) and the RFC 4122 variant (bits 62–63)."""
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))


def parse_request(path: str, body: bytes, headers: Mapping[str, str], *, default_kind: ApiKind | None = None,
                  request_id: str | None = None, require_model: bool = True) -> InferenceRequest:
    """Parse an OpenAI (or Anthropic Messages) request body into an :class:`InferenceRequest`.

    ``headers`` must have lower-case names. Raises ``InvalidJson``, ``BodyNotObject``, ``MissingModel`` or
    ``InvalidShape`` (all ``BadRequest``, HTTP 400). An unknown path is parsed as ``default_kind`` or, when that
    is None, as completions if the body has ``prompt`` and chat completions otherwise. The output limit is the
    first of ``max_completion_tokens``, ``max_tokens``, ``max_output_tokens``; for the Messages API only its
    ``max_tokens``. With ``require_model=False`` (a JSON body wrapped in a gRPC message, whose model the reference
    reads when present) a missing or non-string ``model`` is the empty model instead of ``MissingModel``.
    """
    data = _load_object(body)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        if require_model:
            raise MissingModel("model not found in request body" if model is None
                               else "'model' must be a non-empty string", param="model")
        model = ""
    kind = api_kind_for_path(path) or default_kind or (
        ApiKind.COMPLETIONS if "prompt" in data else ApiKind.CHAT_COMPLETIONS)
    prompt_text = _PROMPT_EXTRACTORS[kind](data)
    rid = request_id or header_text(headers, REQUEST_ID_HEADER) or new_request_id()
    return InferenceRequest(
        request_id=rid,
        model=model,
        api=kind,
        body=data,
        prompt_text=prompt_text,
        input_tokens=max(1, utf8_len(prompt_text) // CHARS_PER_TOKEN),
        max_tokens=_max_tokens(data) if kind is not _MESSAGES else _messages_max_tokens(data),
        stream=_flag(data, "stream"),
        headers=headers,
        fairness_id=header_text(headers, FAIRNESS_ID_HEADER) or DEFAULT_FAIRNESS_ID,
        objective=header_text(headers, OBJECTIVE_HEADER),
        session_token=header_text(headers, SESSION_HEADER),
        cache_salt=data.get("cache_salt") if isinstance(data.get("cache_salt"), str) else None,
        target_model=header_text(headers, MODEL_REWRITE_HEADER) or model,
        body_size=len(body),
    )


def utf8_len(text: str) -> int:
    """Length of ``text`` in UTF-8 bytes: the unit of the reference's estimates (Go's ``len`` of a string) and
    of prefix-cache blocks. O(1) for ASCII text."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def header_text(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header ``name`` (None when absent or empty); for an EPP header with a deprecated alias, the
    alias's when ``name`` is absent, as :func:`epp.headers.header_value` reads it. ``BadRequest`` (naming the
    header read) when it is not valid UTF-8: front ends decode raw bytes with ``surrogateescape``, and such a value
    must never reach a metric label, a log or a JSON body."""
    value = headers.get(name)
    if value is None:  # header_value inlined (the request path's hot spot), keeping the name actually read
        if name not in HEADER_ALIASES:  # `in` and `[]`: a read-only mapping's .get() costs a bound-method call
            return None
        name = HEADER_ALIASES[name]
        value = headers.get(name)
    if not value:
        return None
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidShape(f"header '{name}' is not valid UTF-8 text") from None
    return value


_BOOL_TEXT = {"true": True, "1": True, "yes": True, "on": True, "t": True, "y": True,
              "false": False, "0": False, "no": False, "off": False, "f": False, "n": False}
"""The strings pydantic's lax bool accepts, as vLLM's request models parse them."""


def _flag(data: dict[str, Any], key: str) -> bool:
    """A boolean body field as vLLM's (pydantic, lax) request models read it: JSON booleans, 0/1 and the usual
    words; anything else is a 400 (``bool("false")`` would be True)."""
    value = data.get(key)
    if value is None or value is False or value is True:
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _BOOL_TEXT:
        return _BOOL_TEXT[value.strip().lower()]
    raise InvalidShape(f"'{key}' must be a boolean", param=key)


def _load_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object (``InvalidJson``/``BodyNotObject`` otherwise). A ``\\uXXXX`` escape of a lone
    UTF-16 surrogate (a truncated emoji) becomes U+FFFD, as Go's ``encoding/json`` reads it in the reference;
    orjson refuses such strings, so they are repaired only after orjson failed (the common body pays nothing)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        data = _load_repaired(body, exc)
    if not isinstance(data, dict):
        raise BodyNotObject("request body must be a JSON object")
    return data


def _load_repaired(body: bytes, exc: orjson.JSONDecodeError) -> Any:
    """``body`` parsed with its lone surrogate escapes replaced by ``\\ufffd``; ``InvalidJson`` (orjson's
    first error) when it has none or is invalid for another reason as well."""
    repaired = _SURROGATE_ESCAPE.sub(_repair_escape, body)
    if repaired != body:
        try:
            return orjson.loads(repaired)
        except orjson.JSONDecodeError:
            pass
    raise InvalidJson(f"request body is not valid JSON: {exc}") from exc


_SURROGATE_ESCAPE = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
"""Left to right: an escaped backslash (skipped whole, so that ``\\\\ud83d`` stays text), a valid surrogate
pair, or a lone surrogate escape."""


def _repair_escape(match: re.Match[bytes]) -> bytes:
    """Keep an escaped backslash or a valid pair; a lone surrogate escape becomes U+FFFD."""
    text = match.group()
    return text if len(text) != 6 else b"\\ufffd"


def _max_tokens(data: dict[str, Any]) -> int | None:
    """The output-token limit, read as vLLM's (pydantic, lax) models read an int: an integer, a float without a
    fractional part, or a string of digits; negative or anything else is a 400."""
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = data.get(key)
        if value is None:
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidShape(f"'{key}' must be a non-negative integer", param=key)
        return value
    return None


def _messages_max_tokens(data: dict[str, Any]) -> int | None:
    """The output-token limit of a Messages request: ``max_tokens`` alone, the API's only one (the reference's
    ``tokenLimitFields``; vLLM ignores a ``max_completion_tokens`` there), read as :func:`_max_tokens` reads it."""
    return _max_tokens({"max_tokens": data["max_tokens"]}) if "max_tokens" in data else None


def _chat_text(data: dict[str, Any]) -> str:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidShape("chat completions request needs a non-empty 'messages' array", param="messages")
    return orjson.dumps(messages).decode()


def _completion_text(data: dict[str, Any]) -> str:
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        return prompt[0] if len(prompt) == 1 and isinstance(prompt[0], str) else orjson.dumps(prompt).decode()
    raise InvalidShape("completions request needs a 'prompt' string or array", param="prompt")


def _responses_text(data: dict[str, Any]) -> str:
    if "input" not in data:
        raise InvalidShape("responses request needs 'input'", param="input")
    return orjson.dumps([data.get("instructions"), data.get("tools"), data["input"]]).decode()


def _embeddings_text(data: dict[str, Any]) -> str:
    value = data.get("input")
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        return orjson.dumps(value).decode()
    raise InvalidShape("embeddings request needs 'input'", param="input")


def _messages_text(data: dict[str, Any]) -> str:
    """The Anthropic Messages request flattened as the reference flattens it for prefix-cache estimation
    (``messagesBytes``): the system text, the JSON of ``tools``, then each message's role followed by its text.
    Of the content blocks only ``text`` counts, and an ``image`` contributes a short digest of its source (the
    reference hashes it into placeholder tokens); other blocks (``tool_use``, ``tool_result``, ``thinking``)
    contribute nothing, as in the reference."""
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidShape("messages request needs a non-empty 'messages' array", param="messages")
    parts = [_anthropic_text(data.get("system"), "system")]
    tools = data.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise InvalidShape("'tools' must be an array", param="tools")
        if tools:
            parts.append(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode())  # Go marshals maps sorted
    for message in messages:
        if not isinstance(message, dict):
            raise InvalidShape("each message must be an object", param="messages")
        role = message.get("role")
        if role is not None and not isinstance(role, str):
            raise InvalidShape("a message's 'role' must be a string", param="messages")
        parts.append(role or "")
        parts.append(_anthropic_text(message.get("content"), "messages"))
    return "".join(parts)


def _anthropic_text(content: Any, param: str) -> str:
    """The text of an Anthropic content value: a string, or the ``text`` of its text blocks (images as a
    digest of their source); ``InvalidShape`` for anything else, as the reference's ``AnthropicContent``."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise InvalidShape(f"'{param}' content must be a string or an array of content blocks", param=param)
    out = []
    for block in content:
        if not isinstance(block, dict):
            raise InvalidShape(f"'{param}' content blocks must be objects", param=param)
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if text is not None and not isinstance(text, str):
                raise InvalidShape("a text block's 'text' must be a string", param=param)
            out.append(text or "")
        elif kind == "image":
            source = orjson.dumps(block.get("source"), option=orjson.OPT_SORT_KEYS)
            out.append("<image:" + hashlib.blake2b(source, digest_size=8).hexdigest() + ">")
    return "".join(out)


_PROMPT_EXTRACTORS = {
    ApiKind.CHAT_COMPLETIONS: _chat_text,
    ApiKind.COMPLETIONS: _completion_text,
    ApiKind.RESPONSES: _responses_text,
    ApiKind.EMBEDDINGS: _embeddings_text,
    ApiKind.MESSAGES: _messages_text,
}
