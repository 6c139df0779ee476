"""The HTTP surface of a simulated server: OpenAI-compatible endpoints plus vLLM extras.

Routes: POST /v1/completions, /v1/chat/completions, /v1/responses (``epp_sim.responses``), /v1/messages (the
Anthropic Messages API, ``epp_sim.messages``) here; /v1/embeddings, /tokenize, /detokenize,
/v1/completions/render, /v1/chat/completions/render, /v1/load_lora_adapter, /v1/unload_lora_adapter,
/reset_prefix_cache, /sim/kv_release and GET /v1/models, /health, /metrics, /sim/info in ``epp_sim.endpoints``.
Requests are parsed as vLLM parses them (``epp_sim.protocol``); errors use the OpenAI body
`{"error": {"message", "type", "param", "code"}}` (on /v1/messages, Anthropic's envelope where vLLM uses it).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .endpoints import Endpoints, resolve_model
from .messages import VALIDATION, anthropic_error, message_body, parse_messages, stream_message
from .protocol import (
    ApiError,
    Generation,
    chat_prompt,
    check_context_length,
    check_failure,
    completion_prompts,
    error_response,
    json_response,
    lax_bool,
    lax_int,
    output_limit,
    read_json,
    stream_flags,
    submit,
    transfer_and_priority,
)
from .responses import ResponseShape, chat_messages, stream_response_events
from .seq import Seq
from .streaming import stream_response, usage
from .tokenizer import apply_chat_template

if TYPE_CHECKING:
    from .backend import SimBackend

__all__ = ["ApiError", "build_app"]


class _Api:
    """Request handlers bound to one SimBackend."""

    def __init__(self, srv: SimBackend) -> None:
        self.srv = srv

    # ------------------------------------------------------------- middleware

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        srv = self.srv
        if srv.hung:
            await srv.wait_unhung()
        client_id = request.headers.get("x-request-id")
        try:
            resp = await handler(request)
        except ApiError as exc:
            resp = error_response(exc.status, exc.message, exc.param, exc.err_type)
        if client_id and not resp.prepared:
            resp.headers["x-request-id"] = client_id
        return resp

    # ------------------------------------------------------------- generation

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """Parse and validate a (chat) completion, submit it to the engine, and answer (JSON or SSE)."""
        srv = self.srv
        body = await read_json(request)
        model, lora = resolve_model(srv, body)
        gen = self._generation_params(body, chat)
        await check_failure(srv)
        srv.served.record(body)
        client_id = request.headers.get("x-request-id")
        req_id = srv.next_request_id(client_id)
        pull = gen.remote_prefill and await srv.kv_pull_ok(gen.kvp)
        seq = submit(srv, req_id, gen.ids, max_tokens=gen.max_tokens, lora=lora, priority=gen.priority,
                     cache_salt=gen.salt, remote_prefill=pull, remote_decode=gen.remote_decode)
        seq.stream = gen.stream
        if pull:
            srv.pull_sources[req_id] = gen.kvp
        resp_id = ("chatcmpl-" if chat else "cmpl-") + (client_id or uuid.uuid4().hex)
        head = {"id": resp_id, "object": ("chat.completion" if chat else "text_completion"),
                "created": int(time.time()), "model": model}
        if gen.stream:
            head["object"] = "chat.completion.chunk" if chat else "text_completion"
            return await stream_response(srv, request, seq, head, chat, gen.include_usage,
                                         continuous_usage=gen.continuous_usage)
        while not seq.finished:
            await srv.wait(seq)
        return json_response(self._completion_body(seq, head, chat))

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/responses``: the OpenAI Responses API, text only (see ``epp_sim.responses``)."""
        srv = self.srv
        body = await read_json(request)
        model, lora = resolve_model(srv, body)
        try:
            ids = srv.tokenizer.encode(apply_chat_template(chat_messages(body)))
        except ValueError as exc:
            raise ApiError(400, str(exc), "input") from exc
        max_tokens = output_limit(body, "max_output_tokens")
        check_context_length(srv.cfg.max_model_len, len(ids), max_tokens or 0, "max_output_tokens")
        stream = lax_bool(body.get("stream"), "stream")
        kvp, remote_decode, priority = transfer_and_priority(body, stream)
        await check_failure(srv)
        client_id = request.headers.get("x-request-id")
        req_id = srv.next_request_id(client_id)
        pull = bool(kvp.get("do_remote_prefill")) and await srv.kv_pull_ok(kvp)
        seq = submit(srv, req_id, ids, max_tokens=1 if remote_decode else max_tokens, lora=lora,
                     priority=priority, remote_prefill=pull, remote_decode=remote_decode)
        seq.stream = stream
        if pull:
            srv.pull_sources[req_id] = kvp
        shape = ResponseShape("resp_" + (client_id or uuid.uuid4().hex), model, body)
        if stream:
            return await stream_response_events(srv, request, seq, shape)
        while not seq.finished:
            await srv.wait(seq)
        out = shape.response(seq, srv.output.text(seq.out_start, 0, seq.num_output))
        if kvp:
            out["kv_transfer_params"] = self._kv_transfer_params(seq) if seq.held else None
        return json_response(out)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/messages``: the Anthropic Messages API (see ``epp_sim.messages``)."""
        body = await read_json(request)
        parsed = parse_messages(body)  # a refused body: vLLM's validation error, OpenAI-shaped (the middleware)
        try:
            return await self._messages(request, body, parsed)
        except ApiError as exc:
            if exc.err_type == VALIDATION:
                raise
            return anthropic_error(exc)

    async def _messages(self, request: web.Request, body: dict[str, Any], parsed: Any) -> web.StreamResponse:
        srv = self.srv
        model, lora = resolve_model(srv, body)
        try:
            ids = srv.tokenizer.encode(apply_chat_template(parsed.chat))
        except ValueError as exc:
            raise ApiError(400, str(exc), "messages") from exc
        check_context_length(srv.cfg.max_model_len, len(ids), parsed.max_tokens, "max_completion_tokens")
        kvp, remote_decode, priority = transfer_and_priority(body, parsed.stream)
        await check_failure(srv)
        client_id = request.headers.get("x-request-id")
        req_id = srv.next_request_id(client_id)
        pull = bool(kvp.get("do_remote_prefill")) and await srv.kv_pull_ok(kvp)
        seq = submit(srv, req_id, ids, max_tokens=1 if remote_decode else parsed.max_tokens, lora=lora,
                     priority=priority, remote_prefill=pull, remote_decode=remote_decode)
        seq.stream = parsed.stream
        if pull:
            srv.pull_sources[req_id] = kvp
        msg_id = "chatcmpl-" + (client_id or uuid.uuid4().hex)  # vLLM answers with its chat completion's id
        if parsed.stream:
            return await stream_message(srv, request, seq, msg_id, model)
        while not seq.finished:
            await srv.wait(seq)
        out = message_body(seq, msg_id, model, srv.output.text(seq.out_start, 0, seq.num_output))
        if seq.held:
            out["kv_transfer_params"] = self._kv_transfer_params(seq)
        return json_response(out)

    def _generation_params(self, body: dict[str, Any], chat: bool) -> Generation:
        """The request's prompt and options, validated as vLLM validates them (400 on anything wrong)."""
        if chat:
            ids, max_tokens, out_param = chat_prompt(self.srv, body)
        else:
            batch, max_tokens, out_param = completion_prompts(self.srv, body)
            if len(batch) > 1:
                raise ApiError(400, "batched prompts are not supported by the simulator", "prompt")
            ids = batch[0]
        n = body.get("n")
        if n is not None and lax_int(n, "n") != 1:
            raise ApiError(400, "only n=1 is supported by the simulator", "n")
        check_context_length(self.srv.cfg.max_model_len, len(ids), max_tokens or 0, out_param)
        stream, include_usage, continuous_usage = stream_flags(body)
        kvp, remote_decode, priority = transfer_and_priority(body, stream)
        salt = body.get("cache_salt")
        return Generation(
            ids=ids, max_tokens=1 if remote_decode else max_tokens,  # a prefiller samples one token
            stream=stream, include_usage=include_usage, continuous_usage=continuous_usage,
            kvp=kvp, remote_decode=remote_decode, remote_prefill=bool(kvp.get("do_remote_prefill")),
            priority=priority, salt=salt if isinstance(salt, str) else None)

    def _completion_body(self, seq: Seq, head: dict[str, Any], chat: bool) -> dict[str, Any]:
        text = self.srv.output.text(seq.out_start, 0, seq.num_output)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": seq.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            choice["text"] = text
        choice["stop_reason"] = None
        # vLLM's (Chat)CompletionResponse always has the field: null unless this prefill holds blocks for a decoder.
        kvp = self._kv_transfer_params(seq) if seq.held else None
        return {**head, "choices": [choice], "usage": usage(seq), "kv_transfer_params": kvp}

    def _kv_transfer_params(self, seq: Seq) -> dict[str, Any]:
        srv = self.srv
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(seq.blocks),
            "remote_engine_id": srv.engine_id,
            "remote_request_id": seq.req_id,
            "remote_host": srv.host,
            "remote_port": srv.port,
            "tp_size": 1,
        }


def build_app(srv: SimBackend) -> web.Application:
    """The aiohttp application serving `srv`."""
    api = _Api(srv)
    app = web.Application(middlewares=[api.middleware], client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/completions", api.completions)
    app.router.add_post("/v1/chat/completions", api.chat_completions)
    app.router.add_post("/v1/responses", api.responses)
    app.router.add_post("/v1/messages", api.messages)
    Endpoints(srv).add_routes(app)
    return app
