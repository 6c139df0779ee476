"""The Anthropic Messages API (``POST /v1/messages``), as vLLM serves it.

vLLM turns a Messages request into a chat completion (system text first, ``tool_result`` blocks as ``tool``
messages); the simulator renders that through its chat template, so prompt tokens and prefix caching behave as for
chat completions. Answers, streamed events and errors follow vLLM's shapes, order and field order (Anthropic's error
envelope for handler errors, the OpenAI shape for a body the request model refuses). vLLM reports no cache counts
in this API, and neither does the simulator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from .protocol import ApiError, error_type, lax_bool, lax_int
from .streaming import TokenSink, abort_if_gone, relay_tokens

if TYPE_CHECKING:
    from .backend import SimBackend
    from .engine import Seq

__all__ = ["MessagesRequest", "anthropic_error", "message_body", "parse_messages", "stream_message"]

VALIDATION = "Bad Request"  # the error type of vLLM's request-validation handler (an OpenAI-shaped body)
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "ctx": "user", "msg": "user"}
_BLOCKS = ("text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking")
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_BILLING = "x-anthropic-billing-header"  # Claude Code's per-request header text, which vLLM drops


class MessagesRequest:
    """A validated Messages request: the chat messages it amounts to, its output limit and options."""

    __slots__ = ("chat", "max_tokens", "stream")

    def __init__(self, chat: list[dict[str, Any]], max_tokens: int, stream: bool) -> None:
        self.chat = chat
        self.max_tokens = max_tokens
        self.stream = stream


def _invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param, err_type=VALIDATION)


def parse_messages(body: dict[str, Any]) -> MessagesRequest:
    """Validate ``body`` as vLLM's ``AnthropicMessagesRequest`` and convert it as its serving code does; an
    :class:`ApiError` of type :data:`VALIDATION` for anything the request model refuses."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("'model' is required and must be a non-empty string", "model")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _invalid("'messages' must be a list", "messages")
    if "max_tokens" not in body:
        raise _invalid("'max_tokens' is required", "max_tokens")
    max_tokens = _validated(lax_int, body["max_tokens"], "max_tokens")
    if max_tokens <= 0:
        raise _invalid("Value error, max_tokens must be positive", "max_tokens")
    stream = _validated(lax_bool, body.get("stream"), "stream")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("input_schema"), dict)
            for t in tools)):
        raise _invalid("'tools' must be a list of {name, input_schema}", "tools")
    parsed = [_message(m) for m in messages]
    system = [*_texts(_content(body.get("system"), "system"))]
    for role, content in parsed:
        if role == "system":
            system.extend(_texts(content))
    chat: list[dict[str, Any]] = [{"role": "system", "content": "".join(system)}] if system else []
    for role, content in parsed:
        if role != "system":
            chat.extend(_chat_messages(role, content))
    return MessagesRequest(chat, max_tokens, stream)


def _validated(parse: Any, value: Any, key: str) -> Any:
    """``parse(value, key)`` (a lax pydantic read); its refusal as a validation error."""
    try:
        return parse(value, key)
    except ApiError as exc:
        raise _invalid(exc.message, key) from None


def _message(raw: Any) -> tuple[str, str | list[dict[str, Any]]]:
    if not isinstance(raw, dict) or raw.get("role") not in _ROLES:
        raise _invalid("each message needs a role: user, assistant or system", "messages")
    return _ROLES[raw["role"]], _content(raw.get("content"), "messages", required=True)


def _content(raw: Any, param: str, *, required: bool = False) -> str | list[dict[str, Any]]:
    if raw is None and not required:
        return []
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and all(isinstance(b, dict) and b.get("type") in _BLOCKS for b in raw):
        return raw
    raise _invalid(f"'{param}' content must be a string or a list of content blocks", param)


def _texts(content: str | list[dict[str, Any]]) -> list[str]:
    """The system text parts of a content value (vLLM drops Claude Code's billing header)."""
    if isinstance(content, str):
        return [content] if content else []
    return [b["text"] for b in content if b["type"] == "text" and isinstance(b.get("text"), str) and b["text"]
            and not b["text"].startswith(_BILLING)]


def _chat_messages(role: str, content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages one Anthropic message becomes: ``tool_result`` blocks of a user turn are ``tool``
    messages; text, image and tool-use blocks stay parts of the message (rendered by the chat template)."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content:
        if block["type"] == "tool_result" and role == "user":
            result = block.get("content")
            out.append({"role": "tool", "content": result if isinstance(result, (str, list)) else ""})
        elif block["type"] == "text":
            if block.get("text"):
                parts.append({"type": "text", "text": block["text"]})
        elif block["type"] in ("image", "tool_use"):
            parts.append({"type": block["type"]})
    if parts:
        out.append({"role": role, "content": parts})
    return out


def anthropic_error(exc: ApiError) -> web.Response:
    """``exc`` in Anthropic's envelope, as vLLM's ``translate_error_response`` answers a handler error."""
    body = {"type": "error", "error": {"type": exc.err_type or error_type(exc.status), "message": exc.message}}
    return web.Response(status=exc.status, body=orjson.dumps(body), content_type="application/json")


def message_body(seq: Seq, msg_id: str, model: str, text: str) -> dict[str, Any]:
    """The non-streamed answer of ``seq`` (without ``kv_transfer_params``; the caller adds them)."""
    out: dict[str, Any] = {"id": msg_id, "type": "message", "role": "assistant",
                           "content": [{"type": "text", "text": text}] if text else [], "model": model}
    stop = _STOP_REASONS.get(seq.finish_reason or "")
    if stop is not None:
        out["stop_reason"] = stop
    out["usage"] = {"input_tokens": seq.num_prompt, "output_tokens": seq.num_output}
    return out


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def stream_message(srv: SimBackend, request: web.Request, seq: Seq, msg_id: str,
                         model: str) -> web.StreamResponse:
    """Answer ``seq`` as the Messages API's SSE event stream (see the module docstring)."""
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    client_id = request.headers.get("x-request-id")
    if client_id:
        resp.headers["x-request-id"] = client_id
    with abort_if_gone(srv, seq):
        await resp.prepare(request)
        start: dict[str, Any] = {"id": msg_id, "content": [], "model": model, "stop_reason": None,
                                 "stop_sequence": None, "usage": {"input_tokens": seq.num_prompt, "output_tokens": 0}}
        await resp.write(_event("message_start", {"type": "message_start", "message": start}) + _event(
            "content_block_start", {"type": "content_block_start", "content_block": {"type": "text", "text": ""},
                                    "index": 0}))
        prefix = b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":'
        sink = TokenSink(request.transport, srv.output, prefix, b'},"index":0}\n\n',
                         chunked=resp.headers.get("Transfer-Encoding") == "chunked")
        if not await relay_tokens(srv, seq, sink):
            return resp
        delta: dict[str, Any] = {"type": "message_delta", "delta": {"stop_reason": _STOP_REASONS.get(
            seq.finish_reason or "")}, "usage": {"input_tokens": seq.num_prompt, "output_tokens": seq.num_output}}
        await resp.write(_event("content_block_stop", {"type": "content_block_stop", "index": 0})
                         + _event("message_delta", delta) + _event("message_stop", {"type": "message_stop"}))
        await resp.write_eof()
    return resp
