"""Builders for plugin tests: endpoints with metrics, parsed requests, and plugins built from raw YAML params."""

from __future__ import annotations

from typing import Any, Iterable

import orjson

from epp.framework.endpoint import ROLE_LABEL, Endpoint, EndpointSpec, Metrics
from epp.framework.plugins import CycleState, Handle, NoParams, ScoredEndpoint
from epp.framework.registry import Registry
from epp.framework.request import InferenceRequest, parse_request
from epp.plugins.producers.approx_prefix_cache import ApproxPrefixCacheProducer
from epp.runtime.builtins import default_registry

_REGISTRY: Registry | None = None


class _StandInDetector:
    """Stands in for ``utilization-detector`` (another group's plugin) when that group has not registered it."""

    type_name = "utilization-detector"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name, self.params = name, params

    def saturation(self, endpoints: Any) -> float:
        return 0.0


def registry() -> Registry:
    """The built-in registry (no entry points), built once; config loading needs a default saturation detector."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = default_registry(entry_points=False)
        if "utilization-detector" not in _REGISTRY:
            _REGISTRY.register(_StandInDetector)
    return _REGISTRY


def ep(name: str, *, waiting: int = 0, running: int = 0, kv: float = 0.0, block_size: int | None = None,
       gpu_blocks: int | None = None, running_loras: Iterable[str] = (), waiting_loras: Iterable[str] = (),
       max_lora: int = 0, max_num_seqs: int | None = None, labels: dict[str, str] | None = None,
       role: str | None = None, inflight: int = 0, inflight_tokens: int = 0, update_time: float = 1.0,
       address: str | None = None, port: int = 8000, namespace: str = "") -> Endpoint:
    """An endpoint with one metrics snapshot and the given EPP in-flight counters."""
    lbl = dict(labels or {})
    if role is not None:
        lbl[ROLE_LABEL] = role
    addr = address or f"10.0.0.{sum(map(ord, name)) % 250 + 1}"
    e = Endpoint(EndpointSpec(name=name, address=addr, port=port, labels=lbl, namespace=namespace),
                 Metrics(waiting=waiting, running=running, kv_usage=kv, block_size=block_size,
                         num_gpu_blocks=gpu_blocks, running_loras=frozenset(running_loras),
                         waiting_loras=frozenset(waiting_loras), max_lora=max_lora, max_num_seqs=max_num_seqs,
                         update_time=update_time))
    e.inflight_requests = inflight
    e.inflight_tokens = inflight_tokens
    return e


def req(prompt: str = "hello", *, model: str = "m", max_tokens: int | None = None,
        headers: dict[str, str] | None = None, cache_salt: str | None = None,
        stream: bool = False) -> InferenceRequest:
    """A parsed completions request."""
    body: dict[str, Any] = {"model": model, "prompt": prompt}
    if stream:
        body["stream"] = True
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return parse_request("/v1/completions", orjson.dumps(body), headers or {})


def make(cls: type, raw: dict[str, Any] | None = None, *, name: str | None = None, handle: Handle | None = None,
         **kwargs: Any) -> Any:
    """Build ``cls`` from raw YAML parameters, as the registry does (aliases, validation, defaults)."""
    params = cls.Params.model_validate(raw or {})
    return cls(name or cls.type_name, params, handle or Handle(), **kwargs)


def bind_all(*plugins: Any) -> Handle:
    """Put ``plugins`` in one handle and call every ``bind`` (what the config loader does)."""
    handle = Handle()
    for p in plugins:
        handle.add(p)
    for p in plugins:
        if hasattr(p, "bind"):
            p.bind(handle)
    return handle


def names(endpoints: Iterable[Endpoint]) -> list[str]:
    return [e.name for e in endpoints]


def scored(*pairs: tuple[Endpoint, float]) -> list[ScoredEndpoint]:
    return [ScoredEndpoint(e, s) for e, s in pairs]


def cycle() -> CycleState:
    return CycleState()


def approx_producer(raw: dict[str, Any] | None = None) -> ApproxPrefixCacheProducer:
    """An ``approx-prefix-cache-producer`` hashing one-token blocks, auto-tuning off (``raw`` adds parameters)."""
    return make(ApproxPrefixCacheProducer, {"autoTune": False, "blockSizeTokens": 1, **(raw or {})})
