"""The OpenAI Responses API (``POST /v1/responses``), text in and text out, as vLLM serves it.

A request's ``input`` (a string or text message items) and ``instructions`` become a chat prompt; anything the
simulator cannot honour (``previous_response_id``, non-text parts, ...) is a 400. The answer is OpenAI's ``Response``
object with one ``output_text`` part and full usage (``incomplete`` when ``max_output_tokens`` cut it); a stream is
OpenAI's sequence of typed SSE events ending in ``response.completed``, with no ``[DONE]`` line.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from .streaming import TokenSink, abort_if_gone, relay_tokens

if TYPE_CHECKING:
    from .backend import SimBackend
    from .engine import Seq

__all__ = ["ResponseShape", "chat_messages", "response_usage", "stream_response_events"]

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_TEXT_PARTS = ("input_text", "output_text", "text")
_UNSUPPORTED = ("previous_response_id", "conversation", "background")


def chat_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """The chat messages a Responses request amounts to (``instructions`` first); ValueError names what is
    wrong (the caller answers 400)."""
    for key in _UNSUPPORTED:
        if body.get(key) is not None:
            raise ValueError(f"'{key}' is not supported by the simulator")
    messages: list[dict[str, str]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ValueError("'instructions' must be a string")
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list) and raw:
        messages.extend(_message(item) for item in raw)
    else:
        raise ValueError("'input' must be a string or a non-empty list of message items")
    return messages


def _message(item: Any) -> dict[str, str]:
    if not isinstance(item, dict) or item.get("type", "message") != "message":
        raise ValueError("only message items are supported in 'input'")
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "assistant", "system", "developer"):
        raise ValueError("an input message needs a role: user, assistant, system or developer")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in _TEXT_PARTS
                                         and isinstance(p.get("text"), str) for p in content):
        return {"role": role, "content": "".join(p["text"] for p in content)}
    raise ValueError("message content must be a string or a list of input_text parts")


def response_usage(seq: Seq) -> dict[str, Any]:
    """The Responses API ``usage`` of a request."""
    return {
        "input_tokens": seq.num_prompt,
        "input_tokens_details": {"cached_tokens": seq.cached_tokens},
        "output_tokens": seq.num_output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": seq.num_prompt + seq.num_output,
    }


class ResponseShape:
    """Builds the ``Response`` object and the output message of one request, at any stage."""

    def __init__(self, resp_id: str, model: str, body: dict[str, Any]) -> None:
        self.resp_id = resp_id
        self.msg_id = "msg_" + resp_id.removeprefix("resp_")
        self.model = model
        self.created = int(time.time())
        self.body = body

    def message(self, text: str | None) -> dict[str, Any]:
        """The output message item: in progress and empty (``text`` None) or completed with ``text``."""
        content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"id": self.msg_id, "type": "message", "role": "assistant",
                "status": "in_progress" if text is None else "completed", "content": content}

    def response(self, seq: Seq | None, text: str | None) -> dict[str, Any]:
        """The ``Response`` object: in progress (``seq`` None) or final, with output and usage."""
        body = self.body
        incomplete = seq is not None and seq.finish_reason == "length"
        status = "in_progress" if seq is None else ("incomplete" if incomplete else "completed")
        return {
            "id": self.resp_id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": [] if seq is None else [self.message(text or "")],
            "usage": None if seq is None else response_usage(seq),
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "error": None,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
            "text": {"format": {"type": "text"}}, "truncation": "disabled", "metadata": body.get("metadata") or {},
        }


class _DeltaSink(TokenSink):
    """A :class:`TokenSink` writing one ``response.output_text.delta`` event per token: only the encoding differs
    (each event carries its own ``sequence_number``, so it cannot use one fixed suffix)."""

    __slots__ = ("seqno",)

    def __init__(self, transport: asyncio.Transport | None, srv: SimBackend, prefix: bytes, seqno: int, *,
                 chunked: bool) -> None:
        super().__init__(transport, srv.output, prefix, b"", chunked=chunked)
        self.seqno = seqno

    def _encode(self, pieces: list[bytes]) -> bytes:
        events = []
        for piece in pieces:
            events.append(b'%b%b,"logprobs":[],"sequence_number":%d}\n\n' % (self.prefix, piece, self.seqno))
            self.seqno += 1
        return b"".join(events)


def _event(kind: str, seqno: int, fields: dict[str, Any]) -> bytes:
    data = orjson.dumps({"type": kind, **fields, "sequence_number": seqno})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


async def stream_response_events(srv: SimBackend, request: web.Request, seq: Seq,
                                 shape: ResponseShape) -> web.StreamResponse:
    """Answer ``seq`` as the Responses API's SSE event stream (see the module docstring)."""
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    client_id = request.headers.get("x-request-id")
    if client_id:
        resp.headers["x-request-id"] = client_id
    part = {"item_id": shape.msg_id, "output_index": 0, "content_index": 0}
    with abort_if_gone(srv, seq):
        await resp.prepare(request)
        await resp.write(b"".join([
            _event("response.created", 0, {"response": shape.response(None, None)}),
            _event("response.in_progress", 1, {"response": shape.response(None, None)}),
            _event("response.output_item.added", 2, {"output_index": 0, "item": shape.message(None)}),
            _event("response.content_part.added", 3,
                   {**part, "part": {"type": "output_text", "text": "", "annotations": []}})]))
        prefix = (b"event: response.output_text.delta\ndata: " + orjson.dumps(
            {"type": "response.output_text.delta", **part})[:-1] + b',"delta":')
        sink = _DeltaSink(request.transport, srv, prefix, 4,
                          chunked=resp.headers.get("Transfer-Encoding") == "chunked")
        if not await relay_tokens(srv, seq, sink):
            return resp
        text = srv.output.text(seq.out_start, 0, seq.num_output)
        n = sink.seqno
        await resp.write(b"".join([
            _event("response.output_text.done", n, {**part, "text": text, "logprobs": []}),
            _event("response.content_part.done", n + 1,
                   {**part, "part": {"type": "output_text", "text": text, "annotations": []}}),
            _event("response.output_item.done", n + 2, {"output_index": 0, "item": shape.message(text)}),
            _event("response.completed", n + 3, {"response": shape.response(seq, text)})]))
        await resp.write_eof()
    return resp
