"""``token-producer`` (deprecated alias ``tokenizer``): the prompt's exact token ids, from vLLM's render API or a
local tokenizer.

Before each scheduling cycle (after admission) it gets the ids the model server will see and stores them on
``request.token_ids`` (and vLLM's multimodal ``features`` on ``request.mm_features``) for
``precise-prefix-cache-producer``. Backend ``vllm`` asks a vLLM server to render the request
(``POST {http}/v1/chat/completions/render`` or ``/v1/completions/render``, the client's body with ``model`` set to
``modelName``); backend ``local`` (EPP's own, not the reference's) renders and tokenizes in process with the
model's ``tokenizer.json`` and chat template (:mod:`epp.tokenization`), so there is no round trip per request; it
leaves requests with media parts without ids. Other APIs, several prompts, or a request that already has ids:
nothing to do. A failure leaves the ids unset and the request is scheduled anyway (logged at most once a minute,
counted in :attr:`failures`). Without ``vllm``, ``local`` or ``modelName`` the backend is ``estimate``, which leaves
``request.token_ids`` unset.

YAML::

    - type: token-producer
      parameters:
        modelName: Qwen/Qwen3-0.6B      # required with vllm
        vllm:
          http: http://localhost:8000   # default; no trailing slash
          timeout: 5s                   # text-only requests
          mmTimeout: 30s                # requests with images, audio or video
        # or, instead of vllm:
        local:
          tokenizer: /models/Qwen3-0.6B  # tokenizer.json, or the directory holding it (and the chat template)
          chatTemplate: /path/t.jinja    # optional: else chat_template.jinja or tokenizer_config.json beside it
          workers: 2                     # threads that encode (the GIL is released while they do)
          cacheTokens: 1000000           # ids of prompt sections kept to reuse (0: encode every prompt whole)
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import MappingProxyType
from typing import Any, ClassVar

import aiohttp
import orjson
from pydantic import Field

from epp.config.units import Duration
from epp.errors import ConfigError
from epp.framework.plugins import Handle, PluginService, RequestPreparer
from epp.framework.plugins import Params as PluginParams
from epp.framework.pool import EndpointPool
from epp.framework.request import ApiKind, InferenceRequest, MultiModalFeature, has_media
from epp.kvcache import parse_mm_features
from epp.tokenization import LocalTokenizer, TokenizerLoadError

__all__ = ["TokenProducer"]

log = logging.getLogger(__name__)

_CHAT_PATH = "/v1/chat/completions/render"
_COMPLETIONS_PATH = "/v1/completions/render"
_LOG_EVERY = 60.0
_JSON = MappingProxyType({"Content-Type": "application/json"})


class _VllmParams(PluginParams):
    http: str = Field("http://localhost:8000", alias="http")
    url: str | None = Field(None, description="accepted as a synonym of http (seen in llm-d's docs)")
    timeout: Duration = Field(5.0, gt=0)
    mm_timeout: Duration = Field(30.0, alias="mmTimeout", gt=0)


class _LocalParams(PluginParams):
    tokenizer: str = Field(min_length=1)
    chat_template: str | None = Field(None, alias="chatTemplate")
    workers: int = Field(2, ge=1, le=64)
    cache_tokens: int = Field(1_000_000, alias="cacheTokens", ge=0)


class TokenProducer:
    """Gets each request's prompt token ids from a vLLM render endpoint or a local tokenizer (see the module doc)."""

    type_name: ClassVar[str] = "token-producer"

    class Params(PluginParams):
        model_name: str = Field("", alias="modelName")
        vllm: _VllmParams | None = None
        local: _LocalParams | None = None
        uds_tokenizer_config: dict[str, Any] | None = Field(None, alias="udsTokenizerConfig")
        estimate: dict[str, Any] | None = None

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.backend = "local" if params.local is not None else \
            "vllm" if params.vllm is not None or params.model_name else \
            "uds" if params.uds_tokenizer_config else "estimate"
        if params.local is not None and params.vllm is not None:
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): 'local' and 'vllm' are two backends; "
                              f"give one", plugin=name, field="local")
        if self.backend == "vllm" and not params.model_name:
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): 'modelName' must be specified",
                              plugin=name, field="modelName")
        if params.uds_tokenizer_config:
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): udsTokenizerConfig (llm-d's deprecated "
                              f"gRPC-over-UDS tokenizer) is not implemented; use vllm.http (a vLLM render "
                              f"endpoint)", plugin=name, field="udsTokenizerConfig")
        vllm = params.vllm or _VllmParams()
        self.name = name
        self.params = params
        self.base_url = (vllm.url or vllm.http).rstrip("/")
        self._timeout = vllm.timeout
        self._mm_timeout = vllm.mm_timeout
        self._session: aiohttp.ClientSession | None = None
        self.failures = 0
        self.successes = 0
        self._last_log = -_LOG_EVERY
        self._local = _load_local(name, self.type_name, params.local) if params.local is not None else None

    async def start(self, pool: EndpointPool) -> None:
        """Open the HTTP session of the vllm backend (kept alive across requests)."""
        if self.backend == "vllm":
            self._ensure_session()

    async def stop(self) -> None:
        if self._local is not None:
            self._local.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
        return self._session

    async def prepare(self, request: InferenceRequest) -> None:
        """Set ``request.token_ids`` (see the module doc); never raises for a render failure."""
        if request.token_ids is not None or self.backend == "estimate":
            return
        if self._local is not None:
            await self._prepare_local(self._local, request)
            return
        plan = self._render_plan(request)
        if plan is None:
            return
        if isinstance(plan, list):
            request.token_ids = plan
            return
        path, body, timeout = plan
        try:
            ids, features = await self._render(path, body, timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            self._failed(path, exc)
            return
        self.successes += 1
        if ids:
            request.token_ids = ids
            request.mm_features = features

    async def _prepare_local(self, local: LocalTokenizer, request: InferenceRequest) -> None:
        try:
            ids = await _local_ids(local, request)
        except Exception as exc:  # a RenderError, or the Rust binding's bare Exception: prepare never raises
            self._failed("(local)", exc)
            return
        if ids is None:
            return
        keep = request.body.get("truncate_prompt_tokens")
        if type(keep) is int and keep > 0:
            ids = ids[-keep:]  # vLLM keeps the prompt's last tokens
        request.token_ids = ids
        self.successes += 1

    def _render_plan(self, request: InferenceRequest) -> tuple[str, dict[str, Any], float] | list[int] | None:
        """What to render for ``request``: (path, body, timeout), ids it already carries, or None."""
        body = request.body
        if request.api is ApiKind.CHAT_COMPLETIONS:
            messages = body.get("messages")
            if not isinstance(messages, list):
                return None
            timeout = self._mm_timeout if has_media(messages) else self._timeout
            return _CHAT_PATH, {**body, "model": self.params.model_name}, timeout
        if request.api is ApiKind.COMPLETIONS:
            prompt = _completion_prompt(body)
            if isinstance(prompt, str):
                return _COMPLETIONS_PATH, {**body, "model": self.params.model_name}, self._timeout
            return prompt
        return None

    async def _render(self, path: str, body: dict[str, Any],
                      timeout: float) -> tuple[list[int], tuple[MultiModalFeature, ...]]:
        session = self._ensure_session()
        async with session.post(self.base_url + path, data=orjson.dumps(body), headers=_JSON,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}: {raw[:200].decode('utf-8', 'replace')}")
        data = orjson.loads(raw)
        if isinstance(data, list):
            data = data[0] if data else None
        ids = data.get("token_ids") if isinstance(data, dict) else None
        if not isinstance(ids, list) or not all(type(t) is int for t in ids):
            raise ValueError("the answer has no integer token_ids")
        return ids, parse_mm_features(data.get("features"))

    def _failed(self, path: str, exc: BaseException) -> None:
        self.failures += 1
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY:
            self._last_log = now
            where = f"at {self.base_url}{path}" if self._local is None else f"with {self._local.name}"
            log.warning("plugin '%s' (type: %s): rendering the prompt %s failed (%s: %s); scheduling without "
                        "token ids (%d failures so far)", self.name, self.type_name, where,
                        type(exc).__name__, exc, self.failures)


def _completion_prompt(body: dict[str, Any]) -> str | list[int] | None:
    """A completions body's one prompt: its text, its token ids, or None (several prompts, or none)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt):
        return list(prompt)
    return prompt if isinstance(prompt, str) else None


async def _local_ids(local: LocalTokenizer, request: InferenceRequest) -> list[int] | None:
    """The local backend's ids for ``request``, or None where it has none to give; raises on a failure."""
    body = request.body
    if request.api is ApiKind.CHAT_COMPLETIONS:
        messages = body.get("messages")
        if not isinstance(messages, list) or has_media(messages):
            return None  # placeholder tokens need the model's processor: the render backend has it
        return await local.chat_ids(body)
    if request.api is ApiKind.COMPLETIONS:
        prompt = _completion_prompt(body)
        if isinstance(prompt, str):
            return await local.prompt_ids(prompt, body.get("add_special_tokens") is not False)
        return prompt
    return None


def _load_local(name: str, kind: str, params: _LocalParams) -> LocalTokenizer:
    try:
        return LocalTokenizer.load(params.tokenizer, params.chat_template, params.workers, params.cache_tokens)
    except TokenizerLoadError as exc:
        field = "local.chatTemplate" if exc.field == "chatTemplate" else "local.tokenizer"
        raise ConfigError(f"plugin '{name}' (type: {kind}): {field}: {exc}", plugin=name, field=field) from exc


_check_prepare: type[RequestPreparer] = TokenProducer
_check_service: type[PluginService] = TokenProducer
