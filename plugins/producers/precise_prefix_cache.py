"""``precise-prefix-cache-producer``: prefix-cache matches from what the model servers say they cache.

vLLM publishes a KV-cache event whenever a block enters or leaves its prefix cache (ZMQ); EPP keeps an index of
which endpoint holds which block (:mod:`epp.kvcache`). A request's prompt token ids (from a ``token-producer``,
required beside this producer) are cut into the same blocks, and per endpoint this producer stores a
:class:`~epp.plugins.producers.approx_prefix_cache.PrefixMatch`, read by ``prefix-cache-scorer`` and the other prefix
consumers that name it in ``prefixMatchInfoProducerName``::

    matchBlocks = int(tier-weighted count of consecutive blocks held from the first one)   totalBlocks = full blocks

Without token ids nothing is stored and consumers see no match. Endpoints that leave the pool are unsubscribed and
forgotten. Options EPP does not implement are refused with the reason. Details: docs/prefixcache.md.

With llm-d's names and defaults, in YAML::

    - type: precise-prefix-cache-producer
      parameters:
        tokenProcessorConfig: {blockSize: 16, hashSeed: ""}   # blockSizeTokens is a synonym of blockSize
        indexerConfig:
          kvBlockIndexConfig: {inMemoryConfig: {size: 100000000, podCacheSize: 10}, enableMetrics: false}
          kvCacheBackendConfigs: [{name: gpu, weight: 1.0}, {name: cpu, weight: 0.8}]
        kvEventsConfig:
          topicFilter: "kv@"
          discoverPods: true
          podDiscoveryConfig: {socketPort: 5557}
          zmqEndpoint: ""             # e.g. tcp://*:5557 to have the model servers connect to EPP
        speculativeIndexing: false
        speculativeTTL: 2s
    - type: prefix-cache-scorer
      parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from typing import Any, ClassVar, Iterable

from pydantic import Field

from epp.config.units import Duration
from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import (
    CycleState,
    DataProducer,
    Handle,
    KVIndexMetrics,
    PluginService,
    PreRequest,
    SchedulingResult,
)
from epp.framework.plugins import Params as PluginParams
from epp.framework.pool import EndpointPool
from epp.framework.request import CHARS_PER_TOKEN, InferenceRequest
from epp.kvcache import (
    EventDecodeError,
    KVBlockIndex,
    KVEventSubscribers,
    PodEntry,
    TokenProcessor,
    apply_events,
    decode_batch,
    longest_prefix,
    parse_topic,
    request_extras,
)

from .approx_prefix_cache import DEFAULT_PREFILL_PROFILE, PrefixMatch

__all__ = ["PrecisePrefixCacheProducer", "PRECISE_PRODUCER_TYPE", "TOKEN_PRODUCER_TYPES", "weighted_blocks"]

log = logging.getLogger(__name__)

PRECISE_PRODUCER_TYPE = "precise-prefix-cache-producer"
TOKEN_PRODUCER_TYPES = ("token-producer", "tokenizer")
_RANK = re.compile(r"-rank-(\d+)$")
_GLOBAL = "\x00global"


class _TokenProcessorConfig(PluginParams):
    block_size: int = Field(16, alias="blockSize", gt=0)
    block_size_tokens: int | None = Field(None, alias="blockSizeTokens", gt=0)
    hash_seed: str = Field("", alias="hashSeed")

    @property
    def size(self) -> int:
        return self.block_size_tokens or self.block_size


class _InMemoryConfig(PluginParams):
    size: int = Field(100_000_000, gt=0)
    pod_cache_size: int = Field(10, alias="podCacheSize", gt=0)


class _IndexConfig(PluginParams):
    in_memory_config: _InMemoryConfig | None = Field(None, alias="inMemoryConfig")
    redis_config: dict[str, Any] | None = Field(None, alias="redisConfig")
    valkey_config: dict[str, Any] | None = Field(None, alias="valkeyConfig")
    cost_aware_memory_config: dict[str, Any] | None = Field(None, alias="costAwareMemoryConfig")
    enable_metrics: bool = Field(False, alias="enableMetrics")
    metrics_logging_interval: int = Field(0, alias="metricsLoggingInterval", ge=0, description="nanoseconds")
    max_prefix_blocks_to_match: int | None = Field(None, alias="maxPrefixBlocksToMatch",
                                                   description="in llm-d's samples; llm-d ignores it")


class _Backend(PluginParams):
    name: str
    weight: float
    model_configs: dict[str, Any] | None = Field(None, alias="modelConfigs")


class _IndexerConfig(PluginParams):
    kv_block_index_config: _IndexConfig | None = Field(None, alias="kvBlockIndexConfig")
    tokenizers_pool_config: dict[str, Any] | None = Field(None, alias="tokenizersPoolConfig")
    token_processor_config: _TokenProcessorConfig | None = Field(None, alias="tokenProcessorConfig")
    kv_cache_backend_configs: list[_Backend] | None = Field(None, alias="kvCacheBackendConfigs")


class _PodDiscovery(PluginParams):
    pod_label_selector: str = Field("llm-d.ai/inference-serving=true", alias="podLabelSelector")
    pod_namespace: str = Field("", alias="podNamespace")
    socket_port: int = Field(5557, alias="socketPort", gt=0, lt=65536)
    replay_socket_port: int | None = Field(None, alias="replaySocketPort", gt=0, lt=65536)


class _KVEventsConfig(PluginParams):
    zmq_endpoint: str = Field("", alias="zmqEndpoint")
    topic_filter: str = Field("kv@", alias="topicFilter")
    concurrency: int = Field(4, ge=0)
    engine_type: str = Field("vllm", alias="engineType")
    discover_pods: bool = Field(True, alias="discoverPods")
    pod_discovery_config: _PodDiscovery | None = Field(None, alias="podDiscoveryConfig")
    tracing: bool = False


class PrecisePrefixCacheProducer:
    """Per-endpoint prefix matches from the model servers' KV-cache events (see the module doc)."""

    type_name: ClassVar[str] = PRECISE_PRODUCER_TYPE
    produces_prefix_match: ClassVar[bool] = True
    consumes_endpoint_events: ClassVar[bool] = True
    needs_token_producer: ClassVar[bool] = True

    class Params(PluginParams):
        token_processor_config: _TokenProcessorConfig | None = Field(None, alias="tokenProcessorConfig")
        indexer_config: _IndexerConfig | None = Field(None, alias="indexerConfig")
        kv_events_config: _KVEventsConfig | None = Field(None, alias="kvEventsConfig")
        speculative_indexing: bool = Field(False, alias="speculativeIndexing")
        speculative_ttl: Duration = Field(2.0, alias="speculativeTTL", ge=0)
        session_manager: str | None = Field(None, alias="sessionManager")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        indexer = params.indexer_config or _IndexerConfig()
        _refuse_unsupported(self.type_name, name, params)
        tp = params.token_processor_config or indexer.token_processor_config or _TokenProcessorConfig()
        self.processor = TokenProcessor(tp.size, tp.hash_seed)
        block_index = indexer.kv_block_index_config or _IndexConfig()
        mem = block_index.in_memory_config or _InMemoryConfig()
        self.index = KVBlockIndex(mem.size, mem.pod_cache_size)
        self.enable_metrics = block_index.enable_metrics
        backends = indexer.kv_cache_backend_configs
        self.weights = {b.name.lower(): b.weight for b in backends} if backends else {"gpu": 1.0, "cpu": 0.8}
        self.events = params.kv_events_config or _KVEventsConfig()
        self.socket_port = (self.events.pod_discovery_config or _PodDiscovery()).socket_port
        self.speculative_ttl = params.speculative_ttl if params.speculative_ttl > 0 else 2.0
        self.state_key = f"{self.type_name}/{name}"
        self._subscribers: KVEventSubscribers | None = None
        self._pool: EndpointPool | None = None
        self._speculative: deque[tuple[float, list[int], tuple[PodEntry, ...]]] = deque()
        self._warned_sizes: set[int] = set()
        self.decode_errors = 0
        self.messages = 0

    def bind(self, handle: Handle) -> None:
        """Warn when no ``vllm`` token-producer supplies the prompt's ids: llm-d-router then auto-creates an
        ``estimate`` one, whose pseudo ids match nothing, and loads; EPP loads too, and matches nothing."""
        producers = [p for p in handle.plugins() if p.type_name in TOKEN_PRODUCER_TYPES]
        if self.needs_token_producer and all(getattr(p, "backend", "vllm") == "estimate" for p in producers):
            log.warning("plugin '%s' (type: %s) needs the prompt's token ids, and no token-producer with a vLLM "
                        "render endpoint (vllm/modelName) is configured: no prefix will match", self.name,
                        self.type_name)
        if self.events.pod_discovery_config and self.events.pod_discovery_config.replay_socket_port:
            log.warning("plugin '%s': replaySocketPort is not implemented; KV events published while EPP was not "
                        "connected are not replayed (the index fills from the next ones)", self.name)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, pool: EndpointPool) -> None:
        """Open the subscriber sockets: the global one if configured, and one per endpoint with discoverPods."""
        subs = self._subscribers = KVEventSubscribers(self.on_message, self.events.topic_filter)
        if self.events.zmq_endpoint:
            subs.ensure(_GLOBAL, self.events.zmq_endpoint, bind=True)
        self._pool = pool
        if self.events.discover_pods:
            for ep in pool.endpoints():
                self._subscribe(ep)
        pool.subscribe(self._endpoints_changed)

    async def stop(self) -> None:
        if self._subscribers is not None:
            subs, self._subscribers = self._subscribers, None
            await subs.close()

    def subscriber_addresses(self) -> dict[str, str]:
        """Endpoint name (or "global") -> the ZMQ address its subscriber uses."""
        subs = self._subscribers
        if subs is None:
            return {}
        return {("global" if k == _GLOBAL else k): subs.address(k) or "" for k in subs.keys()}

    def _endpoints_changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        """Forget a removed endpoint: its subscriber, its entries, and the entries filed under its bare address
        (global socket, topic ids without a port) unless another endpoint still has that address."""
        remaining = {ep.address for ep in self._pool.endpoints()} if self._pool is not None else set()
        for ep in removed:
            if self._subscribers is not None:
                self._subscribers.remove(ep.name)
            self.index.remove_pod(ep.hostport)
            if ep.address not in remaining:
                self.index.remove_pod(ep.address)
        if self.events.discover_pods:
            for ep in added:
                self._subscribe(ep)

    def _subscribe(self, ep: Endpoint) -> None:
        if self._subscribers is None:
            return
        m = _RANK.search(ep.name)
        port = self.socket_port + (int(m.group(1)) if m else 0)
        host = f"[{ep.address}]" if ":" in ep.address else ep.address
        self._subscribers.ensure(ep.name, f"tcp://{host}:{port}", owner=ep.hostport)

    # ------------------------------------------------------------------ events

    def on_message(self, topic: str, payload: bytes, owner: str | None) -> None:
        """Apply one KV-event message: per-endpoint sockets file it under ``owner``, the global one under the
        topic's endpoint id."""
        self.messages += 1
        pod, model = parse_topic(topic)
        try:
            events = decode_batch(payload)
        except EventDecodeError as exc:
            self.decode_errors += 1
            if self.decode_errors == 1 or self.decode_errors % 1000 == 0:
                log.warning("plugin '%s': undecodable KV-event message on topic %r (%s); %d so far", self.name,
                            topic, exc, self.decode_errors)
            return
        self._check_block_sizes(events, owner or pod)
        apply_events(self.index, self.processor, owner or pod, model, events)

    def _check_block_sizes(self, events: Iterable[Any], pod: str) -> None:
        for event in events:
            size = getattr(event, "block_size", None)
            if size and size != self.processor.block_size and size not in self._warned_sizes:
                self._warned_sizes.add(size)
                log.warning("plugin '%s': endpoint %s stores blocks of %d tokens but tokenProcessorConfig.blockSize "
                            "is %d; set it to the engine's block size, or prefixes will not match", self.name, pod,
                            size, self.processor.block_size)

    # ------------------------------------------------------------------ scheduling

    def produce(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        """Look the prompt's blocks up and store a :class:`PrefixMatch` (matches by endpoint name)."""
        self._expire_speculative(time.monotonic())
        if not request.token_ids:
            return
        try:
            keys = self.block_keys(request)
        except OverflowError:
            return
        pods: set[str] = set()
        for ep in endpoints:
            pods.add(ep.hostport)
            pods.add(ep.address)
        weighted, _ = longest_prefix(self.index.lookup(keys, pods) if keys else [], self.weights)
        per_endpoint = {ep.name: _best(weighted, ep) for ep in endpoints}
        cycle[self.state_key] = _Match(keys, {n: int(w) for n, w in per_endpoint.items() if int(w)},
                                       self.processor.block_size * CHARS_PER_TOKEN, per_endpoint)

    def block_keys(self, request: InferenceRequest) -> list[int]:
        """The request keys of the prompt's full blocks: its token ids, rooted at the target model, with its
        ``cache_salt`` and multimodal items as extra keys (llm-d's ``computeBlockKeys``); [] without token ids.
        Raises ``OverflowError`` for an id outside 0..2^32-1."""
        tokens = request.token_ids
        if not tokens:
            return []
        size = self.processor.block_size
        extras = request_extras(len(tokens) // size, size, request.cache_salt, request.mm_features)
        return self.processor.keys(tokens, request.target_model or request.model, extras=extras)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """With speculativeIndexing: record the primary target (and prefill endpoint) as holding the prompt."""
        if not self.params.speculative_indexing:
            return
        state = result.cycle.get(self.state_key)
        if not isinstance(state, _Match) or not state.hashes or not result.endpoints:
            return
        targets = [result.endpoints[0]]
        prefill = result.profile_results.get(result.prefill_profile or DEFAULT_PREFILL_PROFILE)
        if prefill is not None and prefill.endpoints:
            targets.append(prefill.endpoints[0])
        entries = tuple(PodEntry(ep.hostport, "gpu", True) for ep in targets)
        self.index.add(state.hashes, entries)
        self._speculative.append((time.monotonic() + self.speculative_ttl, state.hashes, entries))

    def _expire_speculative(self, now: float) -> None:
        queue = self._speculative
        while queue and queue[0][0] <= now:
            _, keys, entries = queue.popleft()
            for key in keys:
                self.index.evict(key, entries, engine=False)

    # ------------------------------------------------------------------ metrics

    def index_metrics(self) -> dict[str, float]:
        """The index's counters, for the ``kvcache_index_*`` metrics llm-d exports with enableMetrics."""
        s = self.index.stats
        return {"admissions_total": s.admissions, "evictions_total": s.evictions, "lookup_requests_total": s.lookups,
                "lookup_keys_total": s.lookup_keys, "lookup_hits_total": s.lookup_hits, "entries": len(self.index)}


class _Match(PrefixMatch):
    """A :class:`PrefixMatch` plus the tier-weighted block counts (``precise-prefix-cache-scorer`` scores them)."""

    __slots__ = ("weighted",)

    def __init__(self, hashes: list[int], matches: dict[str, int], block_chars: int,
                 weighted: dict[str, float]) -> None:
        super().__init__(hashes, matches, block_chars)
        self.weighted = weighted


def weighted_blocks(state: object) -> tuple[dict[str, float], int] | None:
    """From a precise producer's cycle state: (tier-weighted matched blocks by endpoint name, prompt blocks), or
    None when the request had no blocks."""
    if not isinstance(state, _Match) or not state.hashes:
        return None
    return state.weighted, len(state.hashes)


def _best(values: dict[str, Any], ep: Endpoint) -> Any:
    """An endpoint's value under its ``address:port`` id or its bare address (whichever is larger)."""
    return max(values.get(ep.hostport, 0), values.get(ep.address, 0))


def _refuse_unsupported(kind: str, name: str, params: Any) -> None:
    """ConfigError for the parts of llm-d's configuration EPP does not implement."""
    indexer = params.indexer_config or _IndexerConfig()
    events = params.kv_events_config
    if params.session_manager:
        raise ConfigError(f"plugin '{name}' (type: {kind}): sessionManager is not implemented", plugin=name,
                          field="sessionManager")
    block_index = indexer.kv_block_index_config
    # Present at all (even `{}`) selects that backend in llm-d, so presence is what is refused.
    for fld, value in (("redisConfig", block_index and block_index.redis_config),
                       ("valkeyConfig", block_index and block_index.valkey_config),
                       ("costAwareMemoryConfig", block_index and block_index.cost_aware_memory_config)):
        if value is not None:
            raise ConfigError(f"plugin '{name}' (type: {kind}): indexerConfig.kvBlockIndexConfig."
                              f"{fld} is not implemented; EPP keeps the index in memory (inMemoryConfig)",
                              plugin=name, field=f"indexerConfig.kvBlockIndexConfig.{fld}")
    if indexer.tokenizers_pool_config is not None:
        raise ConfigError(f"plugin '{name}' (type: {kind}): indexerConfig.tokenizersPoolConfig "
                          f"(in-process tokenizers) is not implemented; declare a token-producer plugin, which gets "
                          f"the prompt's token ids from a vLLM render endpoint (vllm) or the model's tokenizer files "
                          f"(local)", plugin=name,
                          field="indexerConfig.tokenizersPoolConfig")
    if events is not None and events.engine_type.lower() not in ("", "vllm"):  # "" is vllm in llm-d
        raise ConfigError(f"plugin '{name}' (type: {kind}): kvEventsConfig.engineType "
                          f"'{events.engine_type}' is not implemented (only vllm's KV events are read)", plugin=name,
                          field="kvEventsConfig.engineType")


_check_producer: type[DataProducer] = PrecisePrefixCacheProducer
_check_pre: type[PreRequest] = PrecisePrefixCacheProducer
_check_service: type[PluginService] = PrecisePrefixCacheProducer
_check_metrics: type[KVIndexMetrics] = PrecisePrefixCacheProducer
