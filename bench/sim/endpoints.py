"""The simulator's endpoints besides text generation: embeddings, models and LoRA adapters, tokenizer, vLLM's prompt
render routes, health and metrics, prefix-cache reset, and the simulator's own ``/sim/kv_release``, ``/sim/info``,
``/sim/served`` and ``/sim/fault`` (wedge the server: inference requests fail or hang while the rest keeps answering)."""

from __future__ import annotations

import asyncio
import base64
import random
import time
import uuid
from array import array
from typing import TYPE_CHECKING, Any

from aiohttp import web
from xxhash import xxh3_64_intdigest

from .protocol import (
    COMPLETION_MAX_TOKENS,
    ApiError,
    chat_prompt,
    check_context_length,
    check_failure,
    completion_prompts,
    json_response,
    lax_bool,
    lax_int,
    positive_int,
    prompt_ids,
    read_json,
    stream_flags,
    submit,
)
from .tokenizer import apply_chat_template

if TYPE_CHECKING:
    from .backend import SimBackend

__all__ = ["Endpoints", "resolve_model"]

_METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_INVALID = "InvalidUserInput"  # the error type of vLLM's LoRA load/unload checks
# vLLM's SamplingParams defaults of the request fields a render echoes; its dump omits fields at their default.
_SAMPLING_DEFAULTS: dict[str, Any] = {
    "n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "temperature": 1.0,
    "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None, "stop": None, "stop_token_ids": None, "ignore_eos": False,
    "min_tokens": 0, "prompt_logprobs": None, "skip_special_tokens": True, "spaces_between_special_tokens": True,
    "include_stop_str_in_output": False, "stream_interval": None, "logit_bias": None, "allowed_token_ids": None,
    "bad_words": None, "thinking_token_budget": None,
}
_DELTA, _FINAL_ONLY = 1, 2  # vLLM's RequestOutputKind values: streamed, and answered once


def resolve_model(srv: SimBackend, body: dict[str, Any]) -> tuple[str, str | None]:
    """(served model name, LoRA adapter or None) of a request; 404 for an unknown model."""
    model = body.get("model") or srv.cfg.model
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", "model")
    if model == srv.cfg.model:
        return model, None
    if model in srv.loras:
        return model, model
    raise ApiError(404, f"The model `{model}` does not exist.", "model")


class Endpoints:
    """Request handlers bound to one SimBackend, for everything but the generation routes."""

    def __init__(self, srv: SimBackend) -> None:
        self.srv = srv

    def add_routes(self, app: web.Application) -> None:
        """Register this class's routes on ``app``."""
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/load_lora_adapter", self.load_lora)
        app.router.add_post("/v1/unload_lora_adapter", self.unload_lora)
        app.router.add_post("/v1/completions/render", self.render_completion)
        app.router.add_post("/v1/chat/completions/render", self.render_chat_completion)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_post("/sim/kv_release", self.kv_release)
        app.router.add_get("/sim/info", self.info)
        app.router.add_get("/sim/served", self.served)
        app.router.add_get("/sim/fault", self.get_fault)
        app.router.add_post("/sim/fault", self.set_fault)

    # ------------------------------------------------------------- embeddings

    async def embeddings(self, request: web.Request) -> web.Response:
        """``POST /v1/embeddings``: a deterministic unit vector per input, each a prefill-only engine request."""
        srv = self.srv
        body = await read_json(request)
        model, lora = resolve_model(srv, body)
        ids_list = self._embedding_inputs(body)
        dims = positive_int(body, "dimensions") or srv.cfg.embedding_dim
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise ApiError(400, "'encoding_format' must be 'float' or 'base64'", "encoding_format")
        await check_failure(srv)
        client_id = request.headers.get("x-request-id")
        seqs = [submit(srv, srv.next_request_id(client_id), ids, lora=lora, pooling=True) for ids in ids_list]
        for seq in seqs:
            while not seq.finished:
                await srv.wait(seq)
        data = []
        for i, ids in enumerate(ids_list):
            vec = _embedding(ids, dims, srv.cfg.seed)
            value: Any = vec.tolist() if fmt == "float" else base64.b64encode(vec.tobytes()).decode()
            data.append({"object": "embedding", "index": i, "embedding": value})
        n_tokens = sum(len(ids) for ids in ids_list)
        return json_response({
            "id": "embd-" + (client_id or uuid.uuid4().hex), "object": "list", "created": int(time.time()),
            "model": model, "data": data, "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        })

    def _embedding_inputs(self, body: dict[str, Any]) -> list[array]:
        if "input" not in body:
            raise ApiError(400, "'input' is required", "input")
        raw = body["input"]
        if isinstance(raw, str) or (isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw)):
            raw = [raw]
        if not isinstance(raw, list) or not raw:
            raise ApiError(400, "'input' must be a string, a token list, or a list of them")
        ids_list = [prompt_ids(self.srv, item) for item in raw]
        if any(len(ids) > self.srv.cfg.max_model_len for ids in ids_list):
            raise ApiError(400, "input is longer than the maximum context length", "input")
        return ids_list

    # ------------------------------------------------------------ models, LoRA

    async def models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``: the base model (with ``max_model_len``), then one card per LoRA adapter (``root`` its
        path, ``parent`` the base model), each with one ``ModelPermission``, as vLLM's models serving lists them."""
        srv = self.srv
        created = int(time.time())
        base = srv.cfg.model
        data = [_model_card(base, base, None, srv.cfg.max_model_len, created)]
        data += [_model_card(name, path, base, None, created) for name, path in srv.loras.items()]
        return json_response({"object": "list", "data": data})

    async def load_lora(self, request: web.Request) -> web.Response:
        """``POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace}``, with vLLM's errors."""
        srv = self.srv
        body = await read_json(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.", err_type=_INVALID)
        if not srv.cfg.enable_lora:
            raise ApiError(400, "LoRA is not enabled on this server.")
        if name in srv.loras and not lax_bool(body.get("load_inplace"), "load_inplace"):
            raise ApiError(400, f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                                "in place, set 'load_inplace' to True.", err_type=_INVALID)
        srv.loras[name] = path
        srv.engine.lora_ids.setdefault(name, max(srv.engine.lora_ids.values(), default=0) + 1)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(self, request: web.Request) -> web.Response:
        """``POST /v1/unload_lora_adapter {lora_name}``, with vLLM's errors."""
        srv = self.srv
        body = await read_json(request)
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'lora_name' needs to be provided to unload a LoRA adapter.", err_type=_INVALID)
        if name not in srv.loras:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.")
        del srv.loras[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    # ------------------------------------------------------------------ render

    async def render_completion(self, request: web.Request) -> web.Response:
        """``POST /v1/completions/render``: vLLM's list of ``GenerateRequest``, one per prompt of the body, each
        with the ``token_ids`` that ``/v1/completions`` gives the engine for the same body; nothing is generated."""
        body = await read_json(request)
        resolve_model(self.srv, body)
        batch, limit, param = completion_prompts(self.srv, body)
        return json_response(self._generate_requests(batch, body, limit, param, chat=False))

    async def render_chat_completion(self, request: web.Request) -> web.Response:
        """``POST /v1/chat/completions/render``: vLLM's one ``GenerateRequest``, with the ``token_ids`` that
        ``/v1/chat/completions`` gives the engine for the same body (the same chat template); nothing is generated."""
        body = await read_json(request)
        resolve_model(self.srv, body)
        ids, limit, param = chat_prompt(self.srv, body)
        [rendered] = self._generate_requests([ids], body, limit, param, chat=True)
        return json_response(rendered)

    def _generate_requests(self, batch: list[array], body: dict[str, Any], limit: int | None, param: str, *,
                           chat: bool) -> list[dict[str, Any]]:
        """vLLM's ``GenerateRequest`` (``model_dump``) of each prompt, with its 400s where generation refuses the
        prompt. ``token_offsets`` is always null: the simulator's tokenizers keep no character offsets, which vLLM
        also answers when its tokenizer cannot compute them."""
        max_model_len = self.srv.cfg.max_model_len
        prefix = "chatcmpl-" if chat else "cmpl-"
        stream, _, _ = stream_flags(body)
        priority = body.get("priority")
        salt = body.get("cache_salt")
        out = []
        for ids in batch:
            if not ids:
                raise ApiError(400, "the prompt is empty", "prompt")
            check_context_length(max_model_len, len(ids), limit or 0, param)
            room = max_model_len - len(ids)
            out.append({
                "request_id": prefix + uuid.uuid4().hex, "token_ids": ids.tolist(), "assistant_tokens_mask": None,
                "token_offsets": None, "features": None,
                "sampling_params": _sampling_params(body, room if limit is None else min(limit, room), stream,
                                                    chat=chat),
                "model": body.get("model"), "stream": stream, "stream_options": _stream_options(body, stream),
                "cache_salt": salt if isinstance(salt, str) else None,
                "priority": 0 if priority is None else lax_int(priority, "priority"), "kv_transfer_params": None,
            })
        return out

    # ------------------------------------------------------------------ others

    async def health(self, request: web.Request) -> web.Response:
        """``GET /health``: 200 with an empty body."""
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        """``GET /metrics``: vLLM's Prometheus page, after ``metrics_delay_s``."""
        srv = self.srv
        if srv.cfg.metrics_delay_s:
            await asyncio.sleep(srv.cfg.metrics_delay_s)
        return web.Response(body=srv.metrics.render(srv.engine), headers={"Content-Type": _METRICS_TYPE})

    async def tokenize(self, request: web.Request) -> web.Response:
        """``POST /tokenize {prompt | messages}``."""
        srv = self.srv
        body = await read_json(request)
        if "messages" in body:
            messages = body["messages"]
            if not isinstance(messages, list):
                raise ApiError(400, "'messages' must be a list", "messages")
            ids = srv.tokenizer.encode(apply_chat_template(messages))
        elif "prompt" in body:
            ids = prompt_ids(srv, body["prompt"])
        else:
            raise ApiError(400, "'prompt' or 'messages' is required")
        return json_response(
            {"count": len(ids), "max_model_len": srv.cfg.max_model_len, "tokens": ids.tolist(), "token_strs": None}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        """``POST /detokenize {tokens}``."""
        body = await read_json(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise ApiError(400, "'tokens' must be a list of token ids", "tokens")
        try:
            text = self.srv.tokenizer.decode(tokens)
        except (OverflowError, TypeError) as exc:
            raise ApiError(400, "invalid token ids", "tokens") from exc
        return json_response({"prompt": text})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """``POST /reset_prefix_cache``: forget the cached blocks (only while idle)."""
        return json_response({"success": self.srv.reset_prefix_cache()})

    async def kv_release(self, request: web.Request) -> web.Response:
        """``POST /sim/kv_release {request_id}``: a decoder in another process has pulled these blocks."""
        body = await read_json(request)
        return json_response({"released": self.srv.release_kv(str(body.get("request_id", "")))})

    async def get_fault(self, request: web.Request) -> web.Response:
        """``GET /sim/fault``: ``{"mode", "status"}`` of the current fault, and the ``inference_requests`` seen."""
        return json_response({"mode": self.srv.fault, "status": self.srv.failure_status,
                              "inference_requests": self.srv.inference_requests})

    async def set_fault(self, request: web.Request) -> web.Response:
        """``POST /sim/fault {"mode": "ok"|"fail"|"hang", "status"?}``: wedge or recover the server at run time
        (``SimBackend.set_fault``); answers as ``GET``."""
        body = await read_json(request)
        status = body.get("status")
        if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
            raise ApiError(400, "'status' must be an integer", "status")
        try:
            self.srv.set_fault(str(body.get("mode", "")), status)
        except ValueError as exc:
            raise ApiError(400, str(exc), "status" if "status" in str(exc) else "mode") from exc
        return await self.get_fault(request)

    async def served(self, request: web.Request) -> web.Response:
        """``GET /sim/served``: the keys (:func:`epp_sim.served.prompt_key`) of the (chat) completions accepted, in
        arrival order."""
        return json_response({"served": list(self.srv.served.keys)})

    async def info(self, request: web.Request) -> web.Response:
        """``GET /sim/info``: identity, configuration and live engine counters."""
        srv = self.srv
        e = srv.engine
        st = e.stats
        return json_response(
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


def _model_card(name: str, root: str, parent: str | None, max_model_len: int | None, created: int) -> dict[str, Any]:
    """vLLM's ``ModelCard`` with its one default ``ModelPermission``."""
    permission = {
        "id": "modelperm-" + uuid.uuid4().hex, "object": "model_permission", "created": created,
        "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True, "allow_search_indices": False,
        "allow_view": True, "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False,
    }
    return {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": root, "parent": parent,
            "max_model_len": max_model_len, "permission": [permission]}


def _embedding(ids: array, dims: int, seed: int) -> array:
    rng = random.Random(xxh3_64_intdigest(ids.tobytes(), seed=seed))
    vec = [rng.gauss(0.0, 1.0) for _ in range(dims)]
    norm = sum(v * v for v in vec) ** 0.5 or 1.0
    return array("f", [v / norm for v in vec])


def _sampling_params(body: dict[str, Any], max_tokens: int, stream: bool, *, chat: bool) -> dict[str, Any]:
    """vLLM's ``SamplingParams`` of a rendered request as its dump shows it: only the fields off their default (the
    request's sampling fields, ``max_tokens``, ``output_kind``, ``skip_clone``, ``extra_args``). The simulator
    samples nothing, so these are echoed, not checked."""
    out = {k: v for k, default in _SAMPLING_DEFAULTS.items() if (v := body.get(k)) is not None and v != default}
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    if chat:  # chat's logprobs is a flag, the count its top_logprobs
        logprobs = body.get("top_logprobs", 0) if body.get("logprobs") else None
    else:
        logprobs = body.get("logprobs")
    if logprobs is not None:
        out["logprobs"] = logprobs
    if max_tokens != COMPLETION_MAX_TOKENS:
        out["max_tokens"] = max_tokens
    out["output_kind"] = _DELTA if stream else _FINAL_ONLY
    out["skip_clone"] = True
    xargs = body.get("vllm_xargs")
    extra = dict(xargs) if isinstance(xargs, dict) else {}
    if body.get("kv_transfer_params"):
        extra["kv_transfer_params"] = body["kv_transfer_params"]
    if extra:
        out["extra_args"] = extra
    return out


def _stream_options(body: dict[str, Any], stream: bool) -> dict[str, Any] | None:
    """The request's ``stream_options`` as vLLM's ``StreamOptions`` dumps them (null unless streaming)."""
    options = body.get("stream_options")
    if not stream or not isinstance(options, dict):
        return None
    include, continuous = options.get("include_usage", True), options.get("continuous_usage_stats", False)
    return {
        "include_usage": None if include is None else lax_bool(include, "stream_options", "include_usage"),
        "continuous_usage_stats": None if continuous is None else lax_bool(
            continuous, "stream_options", "continuous_usage_stats"),
    }
