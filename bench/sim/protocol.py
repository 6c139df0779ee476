"""Request parsing and the error shape of the simulator's OpenAI surface, as vLLM's request models read them.

Errors are :class:`ApiError` and are answered by the app's middleware with the OpenAI body
``{"error": {"message", "type", "param", "code"}}`` (vLLM's ``ErrorResponse``).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from .seq import QueueFull, RequestTooLong, Seq
from .tokenizer import apply_chat_template

if TYPE_CHECKING:
    from .backend import SimBackend

__all__ = [
    "COMPLETION_MAX_TOKENS", "ApiError", "Generation", "chat_prompt", "check_context_length", "check_failure",
    "completion_prompts", "error_response", "error_type", "json_response", "lax_bool", "lax_int", "output_limit",
    "positive_int", "prompt_batch", "prompt_ids", "read_json", "stream_flags", "submit", "transfer_and_priority",
]

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}
_BOOL: TypeAdapter[bool] = TypeAdapter(bool)
_INT: TypeAdapter[int] = TypeAdapter(int)
# vLLM's CompletionRequest.max_tokens default, also for an explicit null (its normalize_null_max_tokens); chat and
# the Responses API have none (up to the context length).
COMPLETION_MAX_TOKENS = 16


class ApiError(Exception):
    """An error answered as an OpenAI-style JSON body with `status`; ``err_type`` overrides the type vLLM gives that
    status by default."""

    def __init__(self, status: int, message: str, param: str | None = None, err_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.err_type = err_type


@dataclass(slots=True)
class Generation:
    """A validated generation request: prompt token ids and the options the engine and the answer need."""

    ids: array[int]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    kvp: dict[str, Any]
    remote_decode: bool
    remote_prefill: bool
    priority: int
    salt: str | None


def error_type(status: int) -> str:
    """The error ``type`` vLLM gives ``status`` by default (``BadRequestError``, ``NotFoundError``, ...)."""
    return _ERROR_TYPES.get(status, "APIError")


def error_response(status: int, message: str, param: str | None = None, err_type: str | None = None) -> web.Response:
    """The OpenAI error body for ``status``, its ``type`` named as vLLM names it (or ``err_type``)."""
    body = {
        "error": {
            "message": message,
            "type": err_type or error_type(status),
            "param": param,
            "code": status,
        }
    }
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def json_response(body: Any, headers: dict[str, str] | None = None) -> web.Response:
    """A 200 JSON answer."""
    return web.Response(body=orjson.dumps(body), content_type="application/json", headers=headers)


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; 400 otherwise."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def lax_bool(value: Any, *loc: str) -> bool:
    """A boolean field of the body at ``loc``, parsed as vLLM's pydantic request models parse it (lax mode):
    true/false, 0/1 and, in any case, "true"/"false", "1"/"0", "yes"/"no", "on"/"off", "t"/"f", "y"/"n";
    null is false (the fields are ``Optional[bool]``). Anything else is a 400 carrying FastAPI's error list."""
    return False if value is None else _lax(_BOOL, value, loc)


def lax_int(value: Any, *loc: str) -> int:
    """An integer field of the body at ``loc``, parsed as pydantic's lax mode parses it for vLLM: an integer, a
    float with no fractional part (2.0), a string of one ("5", " 7 "), or a bool; anything else (2.5, "x") is a 400
    carrying FastAPI's error list."""
    return _lax(_INT, value, loc)


def _lax(adapter: TypeAdapter[Any], value: Any, loc: tuple[str, ...]) -> Any:
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        [error] = exc.errors(include_url=False)
        detail = {"type": error["type"], "loc": ("body", *loc), "msg": error["msg"], "input": value}
        raise ApiError(400, str([detail])) from exc


def stream_flags(body: dict[str, Any]) -> tuple[bool, bool, bool]:
    """``stream``, ``stream_options.include_usage`` (a final chunk with the usage) and ``continuous_usage_stats``
    (usage in every chunk too; vLLM honours it only with ``include_usage``) as vLLM reads them."""
    stream = lax_bool(body.get("stream"), "stream")
    options = body.get("stream_options")
    # vLLM's before-validator tests the raw values: "stream": "false" with stream_options passes it.
    if options and not body.get("stream"):
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    if options is None:
        return stream, False, False
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", "stream_options")
    # StreamOptions.include_usage defaults to True in vLLM: "stream_options": {} asks for usage.
    include = stream and lax_bool(options.get("include_usage", True), "stream_options", "include_usage")
    continuous = lax_bool(options.get("continuous_usage_stats"), "stream_options", "continuous_usage_stats")
    return stream, include, include and continuous


def transfer_and_priority(body: dict[str, Any], stream: bool) -> tuple[dict[str, Any], bool, int]:
    """``kv_transfer_params`` (an object), whether this is a prefill request (which cannot stream), and the
    integer ``priority``; 400 on anything else, as vLLM answers."""
    kvp = body.get("kv_transfer_params") or {}
    if not isinstance(kvp, dict):
        raise ApiError(400, "'kv_transfer_params' must be an object", "kv_transfer_params")
    remote_decode = bool(kvp.get("do_remote_decode"))
    if remote_decode and stream:
        raise ApiError(400, "Prefill request (do_remote_decode) cannot be streamed", "stream")
    priority = body.get("priority")
    return kvp, remote_decode, 0 if priority is None else lax_int(priority, "priority")


def output_limit(body: dict[str, Any], key: str) -> int | None:
    """An output-length field (``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``): None when absent
    or null, else a lax int of at least 1; below that, vLLM's ``SamplingParams`` error."""
    value = body.get(key)
    if value is None:
        return None
    value = lax_int(value, key)
    if value < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {value}. (parameter=max_tokens, value={value})",
                       "max_tokens")
    return value


def check_context_length(limit: int, n_prompt: int, max_out: int, out_param: str) -> None:
    """400 when ``n_prompt`` input tokens and ``max_out`` requested output tokens (0 = up to the context length)
    do not fit ``limit`` (max_model_len), with vLLM's messages, each ending as ``str(VLLMValidationError)`` does:
    ``TokenizeParams`` (vllm/renderers/params.py) refuses an output limit beyond the context and a prompt beyond
    ``limit - max_out``; with no output limit, a prompt filling the context leaves ``max_tokens`` 0, which
    ``SamplingParams`` refuses."""
    if max_out > limit:
        # Verbatim, missing space and "{max_total_tokens=}" included.
        raise ApiError(400, f"{out_param}={max_out}cannot be greater than max_model_len=max_total_tokens={limit}. "
                            f"Please request fewer output tokens. (parameter={out_param}, value={max_out})", out_param)
    if n_prompt > limit - max_out:
        raise ApiError(400, f"You passed {n_prompt} input tokens and requested {max_out} output tokens. However, the "
                            f"model's context length is only {limit} tokens, resulting in a maximum input length of "
                            f"{limit - max_out} tokens. Please reduce the length of the input prompt. "
                            f"(parameter=input_tokens, value={n_prompt})", "input_tokens")
    if n_prompt >= limit:
        raise ApiError(400, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens")


def positive_int(body: dict[str, Any], key: str) -> int | None:
    """The positive integer ``body[key]`` (pydantic's lax int), None when absent or null; 400 otherwise."""
    value = body.get(key)
    if value is None:
        return None
    value = lax_int(value, key)
    if value < 1:
        raise ApiError(400, f"'{key}' must be a positive integer", key)
    return value


def prompt_ids(srv: SimBackend, prompt: Any) -> array:
    """The token ids of a completion ``prompt`` (a string, or a list of token ids; a one-element batch of either);
    400 for anything else, batches of several included."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return srv.tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        try:
            return array("I", prompt)
        except OverflowError as exc:
            raise ApiError(400, "token ids must be within [0, 2**32)", "prompt") from exc
    if isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError(400, "batched prompts are not supported by the simulator", "prompt")
    raise ApiError(400, "'prompt' must be a string or a list of token ids", "prompt")


def prompt_batch(srv: SimBackend, prompt: Any) -> list[array]:
    """The token ids of each prompt of a completion ``prompt``: a batch (a list of strings, or of token-id lists)
    gives one per element, anything else the one of :func:`prompt_ids`, which reads every element too."""
    if isinstance(prompt, list) and len(prompt) > 1 and (
            all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt)):
        return [prompt_ids(srv, p) for p in prompt]
    return [prompt_ids(srv, prompt)]


def completion_prompts(srv: SimBackend, body: dict[str, Any]) -> tuple[list[array], int, str]:
    """A completion body's prompt ids (one per prompt of a batch), its output limit (vLLM's default 16 when unset
    or null) and the field that set it; 400 for anything vLLM refuses. Generation and ``/v1/completions/render``
    both read prompts here, so the ids a render returns are the ids the engine caches."""
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required", "prompt")
    limit = output_limit(body, "max_tokens")
    return prompt_batch(srv, body["prompt"]), COMPLETION_MAX_TOKENS if limit is None else limit, "max_tokens"


def chat_prompt(srv: SimBackend, body: dict[str, Any]) -> tuple[array, int | None, str]:
    """A chat body's prompt ids (its ``messages`` through the chat template), its output limit (None: up to the
    context length) and the field that set it; 400 for anything vLLM refuses. Generation and
    ``/v1/chat/completions/render`` both read prompts here, so the ids a render returns are the ids the engine
    caches."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", "messages")
    try:
        ids = srv.tokenizer.encode(apply_chat_template(messages))
    except ValueError as exc:
        raise ApiError(400, str(exc), "messages") from exc
    limit = output_limit(body, "max_completion_tokens")
    if limit is not None:
        return ids, limit, "max_completion_tokens"
    return ids, output_limit(body, "max_tokens"), "max_tokens"


async def check_failure(srv: SimBackend) -> None:
    """Hold the request while the server is wedged with ``hang``; then raise the injected failure, if this request
    draws one (the ``fail`` fault draws every time). Counts the request in ``srv.inference_requests``."""
    srv.inference_requests += 1
    await srv.wait_unwedged()
    if srv.should_fail():
        status = srv.failure_status
        raise ApiError(status, f"injected failure ({status})")


def submit(srv: SimBackend, req_id: str, ids: array, **kw: Any) -> Seq:
    """Queue a request in ``srv``'s engine: a full queue is a 429, a request too long for the cache a 400."""
    try:
        return srv.submit(req_id, ids, **kw)
    except QueueFull as exc:
        raise ApiError(429, str(exc)) from exc
    except (RequestTooLong, ValueError) as exc:
        raise ApiError(400, str(exc)) from exc
