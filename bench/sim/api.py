"""The HTTP surface of a simulated server: OpenAI-compatible endpoints plus vLLM extras.

Routes: POST /v1/completions, /v1/chat/completions, /v1/responses (``bench.sim.responses``), /v1/embeddings, /tokenize,
/detokenize, /v1/load_lora_adapter, /v1/unload_lora_adapter, /reset_prefix_cache,
/sim/kv_release; GET /v1/models, /health, /metrics, /sim/info. Errors use the OpenAI
body `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import base64
import random
import time
import uuid
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from pydantic import TypeAdapter, ValidationError
from xxhash import xxh3_64_intdigest

from bench.sim.engine import QueueFull, RequestTooLong, Seq
from bench.sim.responses import ResponseShape, chat_messages, stream_response_events
from bench.sim.streaming import stream_response, usage
from bench.sim.tokenizer import apply_chat_template

if TYPE_CHECKING:
    from bench.sim.server import SimServer

__all__ = ["ApiError", "build_app"]

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}
_METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_BOOL: TypeAdapter[bool] = TypeAdapter(bool)


@dataclass(slots=True)
class _Generation:
    """A validated generation request: prompt token ids and the options the engine and the answer need."""

    ids: list[int]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    kvp: dict[str, Any]
    remote_decode: bool
    remote_prefill: bool
    priority: int
    salt: str | None


class ApiError(Exception):
    """An error answered as an OpenAI-style JSON body with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    body = {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "APIError"),
            "param": param,
            "code": status,
        }
    }
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _json_response(body: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json", headers=headers)


async def _read_json(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _lax_bool(value: Any, *loc: str) -> bool:
    """A boolean field of the body at ``loc``, parsed as vLLM's pydantic request models parse it (lax mode):
    true/false, 0/1 and, in any case, "true"/"false", "1"/"0", "yes"/"no", "on"/"off", "t"/"f", "y"/"n";
    null is false (the fields are ``Optional[bool]``). Anything else is a 400 carrying FastAPI's error list."""
    if value is None:
        return False
    try:
        return _BOOL.validate_python(value)
    except ValidationError as exc:
        [error] = exc.errors(include_url=False)
        detail = {"type": error["type"], "loc": ("body", *loc), "msg": error["msg"], "input": value}
        raise ApiError(400, str([detail])) from exc


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    """``stream`` and ``stream_options.include_usage`` as vLLM reads them."""
    stream = _lax_bool(body.get("stream"), "stream")
    options = body.get("stream_options")
    # vLLM's before-validator tests the raw values: "stream": "false" with stream_options passes it.
    if options and not body.get("stream"):
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", "stream_options")
    # StreamOptions.include_usage defaults to True in vLLM: "stream_options": {} asks for usage.
    return stream, stream and _lax_bool(options.get("include_usage", True), "stream_options", "include_usage")


def _transfer_and_priority(body: dict[str, Any], stream: bool) -> tuple[dict[str, Any], bool, int]:
    """``kv_transfer_params`` (an object), whether this is a prefill request (which cannot stream), and the
    integer ``priority``; 400 on anything else, as vLLM answers."""
    kvp = body.get("kv_transfer_params") or {}
    if not isinstance(kvp, dict):
        raise ApiError(400, "'kv_transfer_params' must be an object", "kv_transfer_params")
    remote_decode = bool(kvp.get("do_remote_decode"))
    if remote_decode and stream:
        raise ApiError(400, "Prefill request (do_remote_decode) cannot be streamed", "stream")
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ApiError(400, "'priority' must be an integer", "priority")
    return kvp, remote_decode, priority


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(400, f"'{key}' must be a positive integer", key)
    return value


class _Api:
    """Request handlers bound to one SimServer."""

    def __init__(self, srv: SimServer) -> None:
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
            resp = error_response(exc.status, exc.message, exc.param)
        if client_id and not resp.prepared:
            resp.headers["x-request-id"] = client_id
        return resp

    # ---------------------------------------------------------------- helpers

    def _resolve_model(self, body: dict[str, Any]) -> tuple[str, str | None]:
        """(served model name, LoRA adapter or None); 404 for an unknown model."""
        srv = self.srv
        model = body.get("model") or srv.cfg.model
        if not isinstance(model, str):
            raise ApiError(400, "'model' must be a string", "model")
        if model == srv.cfg.model:
            return model, None
        if model in srv.loras:
            return model, model
        raise ApiError(404, f"The model `{model}` does not exist.", "model")

    def _prompt_ids(self, prompt: Any) -> array:
        tok = self.srv.tokenizer
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return tok.encode(prompt)
        if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            try:
                return array("I", prompt)
            except OverflowError as exc:
                raise ApiError(400, "token ids must be within [0, 2**32)", "prompt") from exc
        if isinstance(prompt, list) and len(prompt) > 1:
            raise ApiError(400, "batched prompts are not supported by the simulator", "prompt")
        raise ApiError(400, "'prompt' must be a string or a list of token ids", "prompt")

    def _check_failure(self) -> None:
        srv = self.srv
        if srv.should_fail():
            status = srv.cfg.failure_status
            raise ApiError(status, f"injected failure ({status})")

    def _submit(self, req_id: str, ids: array, **kw: Any) -> Seq:
        try:
            return self.srv.submit(req_id, ids, **kw)
        except QueueFull as exc:
            raise ApiError(429, str(exc)) from exc
        except (RequestTooLong, ValueError) as exc:
            raise ApiError(400, str(exc)) from exc

    # ------------------------------------------------------------- generation

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """Parse and validate a (chat) completion, submit it to the engine, and answer (JSON or SSE)."""
        srv = self.srv
        body = await _read_json(request)
        model, lora = self._resolve_model(body)
        gen = self._generation_params(body, chat)
        self._check_failure()
        client_id = request.headers.get("x-request-id")
        req_id = srv.next_request_id(client_id)
        pull = gen.remote_prefill and await srv.kv_pull_ok(gen.kvp)
        seq = self._submit(req_id, gen.ids, max_tokens=gen.max_tokens, lora=lora, priority=gen.priority,
                           cache_salt=gen.salt, remote_prefill=pull, remote_decode=gen.remote_decode)
        seq.stream = gen.stream
        if pull:
            srv.pull_sources[req_id] = gen.kvp
        resp_id = ("chatcmpl-" if chat else "cmpl-") + (client_id or uuid.uuid4().hex)
        head = {"id": resp_id, "object": ("chat.completion" if chat else "text_completion"),
                "created": int(time.time()), "model": model}
        if gen.stream:
            head["object"] = "chat.completion.chunk" if chat else "text_completion"
            return await stream_response(srv, request, seq, head, chat, gen.include_usage)
        while not seq.finished:
            await srv.wait(seq)
        return _json_response(self._completion_body(seq, head, chat, gen))

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/responses``: the OpenAI Responses API, text only (see ``bench.sim.responses``)."""
        srv = self.srv
        body = await _read_json(request)
        model, lora = self._resolve_model(body)
        try:
            ids = srv.tokenizer.encode(apply_chat_template(chat_messages(body)))
        except ValueError as exc:
            raise ApiError(400, str(exc), "input") from exc
        max_tokens = _positive_int(body, "max_output_tokens")
        self._check_length(len(ids), max_tokens, "input")
        stream = _lax_bool(body.get("stream"), "stream")
        kvp, remote_decode, priority = _transfer_and_priority(body, stream)
        self._check_failure()
        client_id = request.headers.get("x-request-id")
        req_id = srv.next_request_id(client_id)
        pull = bool(kvp.get("do_remote_prefill")) and await srv.kv_pull_ok(kvp)
        seq = self._submit(req_id, ids, max_tokens=1 if remote_decode else max_tokens, lora=lora,
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
        return _json_response(out)

    def _generation_params(self, body: dict[str, Any], chat: bool) -> _Generation:
        """The request's prompt and options, validated as vLLM validates them (400 on anything wrong)."""
        ids, max_tokens = self._chat_prompt(body) if chat else self._completion_prompt(body)
        if body.get("n", 1) != 1:
            raise ApiError(400, "only n=1 is supported by the simulator", "n")
        self._check_length(len(ids), max_tokens, "messages" if chat else "prompt")
        stream, include_usage = _stream_flags(body)
        kvp, remote_decode, priority = _transfer_and_priority(body, stream)
        salt = body.get("cache_salt")
        return _Generation(
            ids=ids, max_tokens=1 if remote_decode else max_tokens,  # a prefiller samples one token
            stream=stream, include_usage=include_usage,
            kvp=kvp, remote_decode=remote_decode, remote_prefill=bool(kvp.get("do_remote_prefill")),
            priority=priority, salt=salt if isinstance(salt, str) else None)

    def _chat_prompt(self, body: dict[str, Any]) -> tuple[list[int], int | None]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list", "messages")
        try:
            ids = self.srv.tokenizer.encode(apply_chat_template(messages))
        except ValueError as exc:
            raise ApiError(400, str(exc), "messages") from exc
        max_tokens = _positive_int(body, "max_completion_tokens")
        return ids, max_tokens if max_tokens is not None else _positive_int(body, "max_tokens")

    def _completion_prompt(self, body: dict[str, Any]) -> tuple[list[int], int | None]:
        if "prompt" not in body:
            raise ApiError(400, "'prompt' is required", "prompt")
        return self._prompt_ids(body["prompt"]), _positive_int(body, "max_tokens")

    def _check_length(self, n_prompt: int, max_tokens: int | None, prompt_param: str) -> None:
        limit = self.srv.cfg.max_model_len
        if n_prompt >= limit or n_prompt + (max_tokens or 0) > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, "
                f"you requested {n_prompt + (max_tokens or 0)} tokens ({n_prompt} in the "
                f"messages, {max_tokens or 0} in the completion). Please reduce the length of "
                "the messages or completion.",
                "max_tokens" if max_tokens else prompt_param,
            )

    def _completion_body(self, seq: Seq, head: dict[str, Any], chat: bool, gen: _Generation) -> dict[str, Any]:
        text = self.srv.output.text(seq.out_start, 0, seq.num_output)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": seq.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            choice["text"] = text
        choice["stop_reason"] = None
        out: dict[str, Any] = {**head, "choices": [choice], "usage": usage(seq)}
        if gen.remote_decode or gen.remote_prefill:
            out["kv_transfer_params"] = self._kv_transfer_params(seq) if seq.held else None
        return out

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

    # ------------------------------------------------------------- embeddings

    async def embeddings(self, request: web.Request) -> web.Response:
        srv = self.srv
        body = await _read_json(request)
        model, lora = self._resolve_model(body)
        if "input" not in body:
            raise ApiError(400, "'input' is required", "input")
        raw = body["input"]
        if isinstance(raw, str) or (
            isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw)
        ):
            raw = [raw]
        if not isinstance(raw, list) or not raw:
            raise ApiError(400, "'input' must be a string, a token list, or a list of them")
        dims = _positive_int(body, "dimensions") or srv.cfg.embedding_dim
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise ApiError(400, "'encoding_format' must be 'float' or 'base64'", "encoding_format")
        ids_list = [self._prompt_ids(item) for item in raw]
        for ids in ids_list:
            if len(ids) > srv.cfg.max_model_len:
                raise ApiError(400, "input is longer than the maximum context length", "input")
        self._check_failure()
        client_id = request.headers.get("x-request-id")
        seqs = [
            self._submit(srv.next_request_id(client_id), ids, lora=lora, pooling=True)
            for ids in ids_list
        ]
        for seq in seqs:
            while not seq.finished:
                await srv.wait(seq)
        data = []
        for i, ids in enumerate(ids_list):
            vec = _embedding(ids, dims, srv.cfg.seed)
            value: Any = vec.tolist()
            if fmt == "base64":
                value = base64.b64encode(vec.tobytes()).decode()
            data.append({"object": "embedding", "index": i, "embedding": value})
        n_tokens = sum(len(ids) for ids in ids_list)
        return _json_response(
            {
                "id": "embd-" + (client_id or uuid.uuid4().hex),
                "object": "list",
                "created": int(time.time()),
                "model": model,
                "data": data,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            }
        )

    # ----------------------------------------------------------------- others

    async def models(self, request: web.Request) -> web.Response:
        srv = self.srv
        created = int(time.time())

        def card(name: str, root: str, parent: str | None) -> dict[str, Any]:
            return {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": parent,
                "max_model_len": srv.cfg.max_model_len,
            }

        data = [card(srv.cfg.model, srv.cfg.model, None)]
        data += [card(name, path, srv.cfg.model) for name, path in srv.loras.items()]
        return _json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        srv = self.srv
        if srv.cfg.metrics_delay_s:
            await asyncio.sleep(srv.cfg.metrics_delay_s)
        body = srv.metrics.render(srv.engine)
        return web.Response(body=body, headers={"Content-Type": _METRICS_TYPE})

    async def load_lora(self, request: web.Request) -> web.Response:
        srv = self.srv
        body = await _read_json(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.")
        if not srv.cfg.enable_lora:
            raise ApiError(400, "LoRA is not enabled on this server.")
        if name in srv.loras:
            raise ApiError(400, f"The lora adapter '{name}' has already been loaded.", "lora_name")
        srv.loras[name] = path
        srv.engine.lora_ids.setdefault(name, max(srv.engine.lora_ids.values(), default=0) + 1)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(self, request: web.Request) -> web.Response:
        srv = self.srv
        body = await _read_json(request)
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'lora_name' must be provided.", "lora_name")
        if name not in srv.loras:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.", "lora_name")
        del srv.loras[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def tokenize(self, request: web.Request) -> web.Response:
        srv = self.srv
        body = await _read_json(request)
        if "messages" in body:
            messages = body["messages"]
            if not isinstance(messages, list):
                raise ApiError(400, "'messages' must be a list", "messages")
            ids = srv.tokenizer.encode(apply_chat_template(messages))
        elif "prompt" in body:
            ids = self._prompt_ids(body["prompt"])
        else:
            raise ApiError(400, "'prompt' or 'messages' is required")
        return _json_response(
            {
                "count": len(ids),
                "max_model_len": srv.cfg.max_model_len,
                "tokens": ids.tolist(),
                "token_strs": None,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await _read_json(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise ApiError(400, "'tokens' must be a list of token ids", "tokens")
        try:
            text = self.srv.tokenizer.decode(tokens)
        except (OverflowError, TypeError) as exc:
            raise ApiError(400, "invalid token ids", "tokens") from exc
        return _json_response({"prompt": text})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        ok = self.srv.reset_prefix_cache()
        return _json_response({"success": ok})

    async def kv_release(self, request: web.Request) -> web.Response:
        body = await _read_json(request)
        ok = self.srv.release_kv(str(body.get("request_id", "")))
        return _json_response({"released": ok})

    async def info(self, request: web.Request) -> web.Response:
        srv = self.srv
        e = srv.engine
        st = e.stats
        return _json_response(
            {
                "model": srv.cfg.model,
                "url": srv.url,
                "role": srv.cfg.role,
                "batching": srv.cfg.batching,
                "engine_id": srv.engine_id,
                "kv_events_endpoint": srv.kv_publisher.endpoint if srv.kv_publisher else None,
                "running": e.num_running,
                "waiting": e.num_waiting,
                "kv_usage": e.kv_usage,
                "preemptions": st.num_preemptions,
                "prefix_cache_queries": st.prefix_cache_queries,
                "prefix_cache_hits": st.prefix_cache_hits,
                "kv_load_failures": st.kv_load_failures,
                "generation_tokens": st.generation_tokens,
                "config": srv.cfg.model_dump(),
            }
        )


def _embedding(ids: array, dims: int, seed: int) -> array:
    rng = random.Random(xxh3_64_intdigest(ids.tobytes(), seed=seed))
    vec = [rng.gauss(0.0, 1.0) for _ in range(dims)]
    norm = sum(v * v for v in vec) ** 0.5 or 1.0
    return array("f", [v / norm for v in vec])


def build_app(srv: SimServer) -> web.Application:
    """The aiohttp application serving `srv`."""
    api = _Api(srv)
    app = web.Application(middlewares=[api.middleware], client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/completions", api.completions)
    app.router.add_post("/v1/chat/completions", api.chat_completions)
    app.router.add_post("/v1/responses", api.responses)
    app.router.add_post("/v1/embeddings", api.embeddings)
    app.router.add_get("/v1/models", api.models)
    app.router.add_get("/health", api.health)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_post("/v1/load_lora_adapter", api.load_lora)
    app.router.add_post("/v1/unload_lora_adapter", api.unload_lora)
    app.router.add_post("/tokenize", api.tokenize)
    app.router.add_post("/detokenize", api.detokenize)
    app.router.add_post("/reset_prefix_cache", api.reset_prefix_cache)
    app.router.add_post("/sim/kv_release", api.kv_release)
    app.router.add_get("/sim/info", api.info)
    return app
