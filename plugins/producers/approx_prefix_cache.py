"""``approx-prefix-cache-producer``: EPP's own estimate of which endpoint holds which prompt prefix in its KV cache.

It hashes the request and looks the hashes up in an index of what was sent where; consumers
(``prefix-cache-scorer``, ``prefix-cache-affinity-filter``, ``no-hit-lru-scorer``, ``prefix-based-pd-decider``,
``pd-profile-handler``) read its :class:`PrefixMatch` from the cycle state. The config loader creates it for any
plugin whose class lists it in ``consumes``::

    block = blockSizeTokens × 4 characters (or hashBlockSize characters, v0.3)
    h0    = xxhash64(target_model ‖ cache_salt)
    h_i   = xxhash64(block_i ‖ LE-uint64(h_{i-1}))     # the trailing partial block is hashed too

The match walks ``h_1, h_2, ...`` and stops at the first hash no endpoint holds. The index is ``hash -> {endpoint
names}`` plus one LRU per endpoint; after a pick :meth:`pre_request` adds every request hash for the primary target
and the prefill endpoint. The index lives on the event loop (no locks): call it only from there.

YAML::

    - type: approx-prefix-cache-producer
      parameters:
        autoTune: true             # block size and LRU size from vllm:cache_config_info when known
        blockSizeTokens: 16
        maxPrefixBlocksToMatch: 256
        maxPrefixTokensToMatch: 0  # > 0 overrides maxPrefixBlocksToMatch (tokens / block size)
        lruCapacityPerServer: 31250
        prefixHashSource: body     # the only source EPP has
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Protocol, runtime_checkable

import xxhash
from pydantic import Field

from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import (
    BlockListener,
    CycleState,
    DataProducer,
    Handle,
    Params,
    PrefixIndexMetrics,
    PreRequest,
    SchedulingResult,
    SharedBlockIndex,
)
from epp.framework.request import CHARS_PER_TOKEN, InferenceRequest

__all__ = ["ApproxPrefixCacheProducer", "PrefixMatch", "PrefixCacheStats", "PrefixCacheParams", "PRODUCER_TYPE",
           "DEFAULT_PREFILL_PROFILE", "PRODUCER_FIELDS", "BlockConfigError", "hash_prompt", "block_config",
           "producer_fields", "find_prefix_producer", "PRODUCER_NAME_FIELD", "PrefixMatchProducer"]

PRODUCER_TYPE = "approx-prefix-cache-producer"
PRODUCER_NAME_FIELD = "prefixMatchInfoProducerName"
"""The consumers' parameter naming the producer whose match info they read (llm-d PR #1183)."""
DEFAULT_PREFILL_PROFILE = "prefill"
_ABSENT = object()

_xxh64 = xxhash.xxh64_intdigest


class PrefixCacheParams(Params):
    """The producer's parameters; ``prefix-cache-scorer`` accepts the same ones and passes them on."""

    auto_tune: bool = Field(True, alias="autoTune")
    block_size_tokens: int = Field(16, alias="blockSizeTokens", ge=1)
    block_size: int | None = Field(None, alias="blockSize", ge=1, description="deprecated, in characters")
    hash_block_size: int | None = Field(None, alias="hashBlockSize", ge=1, description="v0.3, in characters")
    max_prefix_blocks_to_match: int = Field(256, alias="maxPrefixBlocksToMatch", ge=0)
    max_prefix_tokens_to_match: int = Field(0, alias="maxPrefixTokensToMatch", ge=0)
    lru_capacity_per_server: int = Field(31250, alias="lruCapacityPerServer", ge=1)
    prefix_hash_source: Literal["body", "metadata"] = Field("body", alias="prefixHashSource")


PRODUCER_FIELDS = tuple(PrefixCacheParams.model_fields)


class BlockConfigError(ValueError):
    """An invalid combination of block-size parameters; ``field`` is the YAML key to blame."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def block_config(params: PrefixCacheParams) -> tuple[int | None, int]:
    """``(fixed block size in characters or None when auto-tuned, fallback block size in tokens)``.

    Raises :class:`BlockConfigError` for the reference's invalid combinations.
    """
    fields_set = params.model_fields_set
    if params.block_size is not None and "block_size_tokens" not in fields_set:
        raise BlockConfigError("blockSize", "blockSize is deprecated (it counts characters); set blockSizeTokens "
                               "instead")
    if params.hash_block_size is not None:
        if "block_size_tokens" in fields_set:
            raise BlockConfigError("hashBlockSize", "hashBlockSize (v0.3, characters) and blockSizeTokens cannot "
                                   "both be set")
        return params.hash_block_size, max(1, params.hash_block_size // CHARS_PER_TOKEN)
    if params.auto_tune:
        return None, params.block_size_tokens
    return params.block_size_tokens * CHARS_PER_TOKEN, params.block_size_tokens


def hash_prompt(model: str, cache_salt: str | None, text: str, block_chars: int, max_blocks: int) -> list[int]:
    """Chained xxhash64 of ``text`` in blocks of ``block_chars`` bytes, seeded by model and salt (see module doc)."""
    data = text.encode()
    if len(data) < block_chars:
        return []
    limit = block_chars * max_blocks
    if len(data) > limit:
        data = data[:limit]
    prev = _xxh64((model + (cache_salt or "")).encode())
    out: list[int] = []
    append = out.append
    for i in range(0, len(data), block_chars):
        prev = _xxh64(data[i:i + block_chars] + prev.to_bytes(8, "little"))
        append(prev)
    return out


@dataclass(slots=True)
class PrefixMatch:
    """What the producer found for one request: its hashes and, per endpoint name, how many blocks match."""

    hashes: list[int]
    matches: dict[str, int]
    block_chars: int

    @property
    def total_blocks(self) -> int:
        return len(self.hashes)

    @property
    def block_size_tokens(self) -> float:
        """Block size in (estimated) tokens: characters / 4."""
        return self.block_chars / CHARS_PER_TOKEN

    def match_blocks(self, endpoint_name: str) -> int:
        return self.matches.get(endpoint_name, 0)

    def cached_tokens(self, endpoint_name: str) -> int:
        """Whole (estimated) tokens of the request's prefix the endpoint holds."""
        return self.matches.get(endpoint_name, 0) * self.block_chars // CHARS_PER_TOKEN

    def score(self, endpoint_name: str) -> float:
        """``matchBlocks / totalBlocks``; 0 when the request has no blocks."""
        total = len(self.hashes)
        return self.matches.get(endpoint_name, 0) / total if total else 0.0


@dataclass(slots=True)
class PrefixCacheStats:
    """Hit statistics over picks so far: blocks of the request already on the chosen target vs all blocks."""

    requests: int = 0
    matched_blocks: int = 0
    total_blocks: int = 0
    matched_tokens: int = 0
    total_tokens: int = 0

    @property
    def hit_ratio(self) -> float:
        return self.matched_blocks / self.total_blocks if self.total_blocks else 0.0


@runtime_checkable
class PrefixMatchProducer(Protocol):
    """What a consumer reads of the producer it is bound to: where the producer stores its :class:`PrefixMatch` in
    the cycle state (``state_key``), and its name and parameters for error messages and agreement checks."""

    produces_prefix_match: ClassVar[bool]

    @property
    def name(self) -> str: ...

    @property
    def params(self) -> Params: ...

    @property
    def state_key(self) -> str: ...


class ApproxPrefixCacheProducer:
    """Hashes each request, matches it against the prefix index, and records picks into the index."""

    type_name: ClassVar[str] = PRODUCER_TYPE
    produces_prefix_match: ClassVar[bool] = True
    Params = PrefixCacheParams

    def __init__(self, name: str, params: PrefixCacheParams, handle: Handle) -> None:
        self.name = name
        self.params = params
        try:
            self._fixed_block_chars, self._block_tokens = block_config(params)
        except BlockConfigError as exc:
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): {exc}", plugin=name,
                              field=exc.field) from exc
        if params.prefix_hash_source != "body":
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): prefixHashSource 'metadata' is not "
                              "supported: EPP hashes the request body (prefixHashSource: body)", plugin=name,
                              field="prefixHashSource")
        self._auto_tune = params.auto_tune
        self._max_blocks = params.max_prefix_blocks_to_match
        self._max_tokens = params.max_prefix_tokens_to_match
        self._lru_capacity = params.lru_capacity_per_server
        self.state_key = f"{PRODUCER_TYPE}/{name}"
        self._hash_to_eps: dict[int, set[str]] = {}
        self._lrus: dict[str, dict[int, None]] = {}
        self._capacity: dict[str, int] = {}
        self._stats = PrefixCacheStats()
        self.observer: Callable[[int, int], None] | None = None
        """Called with (matched bytes, total bytes) of each routed request's prefix, e.g. the hit-ratio metric."""
        self._block_listeners: list[BlockListener] = []

    @property
    def fixed_block_chars(self) -> int | None:
        """The block size in characters when it cannot change at run time (no auto-tune), else None."""
        return self._fixed_block_chars

    def block_chars(self, endpoints: list[Endpoint]) -> int:
        """Block size in characters for a cycle: the first endpoint's scraped block size when auto-tuning."""
        if self._fixed_block_chars is not None:
            return self._fixed_block_chars
        if endpoints:
            bs = endpoints[0].metrics.block_size
            if bs:
                return bs * CHARS_PER_TOKEN
        return self._block_tokens * CHARS_PER_TOKEN

    def hashes(self, request: InferenceRequest, block_chars: int) -> list[int]:
        """The request's chained block hashes at ``block_chars`` characters per block."""
        max_blocks = self._max_blocks
        if self._max_tokens > 0:
            max_blocks = max(1, self._max_tokens * CHARS_PER_TOKEN // block_chars)
        return hash_prompt(request.target_model, request.cache_salt, request.prompt_text, block_chars, max_blocks)

    def match(self, hashes: list[int]) -> dict[str, int]:
        """Per endpoint name, the number of leading hashes it holds (stopping at the first hash nobody holds)."""
        found: dict[str, int] = {}
        lookup, count = self._hash_to_eps.get, found.get
        for h in hashes:
            holders = lookup(h)
            if not holders:
                break
            for name in holders:
                found[name] = count(name, 0) + 1
        return found

    def produce(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        """Hash the request and store its :class:`PrefixMatch` in ``cycle`` under :attr:`state_key`."""
        block_chars = self.block_chars(endpoints)
        hashes = self.hashes(request, block_chars)
        cycle[self.state_key] = PrefixMatch(hashes, self.match(hashes), block_chars)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """Index every request hash on the primary target and on the prefill endpoint, and count the hit."""
        endpoints = result.endpoints
        if not endpoints:
            return
        target = endpoints[0]
        state = result.cycle.get(self.state_key)
        if not isinstance(state, PrefixMatch):
            block_chars = self.block_chars(endpoints)
            hashes = self.hashes(request, block_chars)
            state = PrefixMatch(hashes, self.match(hashes), block_chars)
        self._record(state, target.name)
        self.add(state.hashes, target)
        prefill = result.prefill
        if prefill is None:
            res = result.profile_results.get(DEFAULT_PREFILL_PROFILE)
            prefill = res.endpoints[0] if res is not None and res.endpoints else None
        if prefill is not None and prefill is not target:
            self.add(state.hashes, prefill)

    def _record(self, state: PrefixMatch, target: str) -> None:
        st = self._stats
        matched = state.match_blocks(target)
        st.requests += 1
        st.matched_blocks += matched
        st.total_blocks += state.total_blocks
        st.matched_tokens += matched * state.block_chars // CHARS_PER_TOKEN
        st.total_tokens += state.total_blocks * state.block_chars // CHARS_PER_TOKEN
        if self.observer is not None:
            self.observer(matched * state.block_chars, state.total_blocks * state.block_chars)

    def add(self, hashes: list[int], endpoint: Endpoint) -> None:
        """Record that ``endpoint`` now caches ``hashes`` (most recent last) and tell the block listeners."""
        self._insert(hashes, endpoint)
        for listener in self._block_listeners:
            listener(hashes, endpoint)

    def on_blocks_added(self, listener: BlockListener) -> None:
        """Call ``listener(hashes, endpoint)`` after each :meth:`add` (e.g. to share it with other workers)."""
        self._block_listeners.append(listener)

    def add_peer_blocks(self, hashes: list[int], endpoint: Endpoint) -> None:
        """Index what another worker added, without telling the listeners (they would send it back)."""
        self._insert(hashes, endpoint)

    def _insert(self, hashes: list[int], endpoint: Endpoint) -> None:
        """Index ``hashes`` on ``endpoint`` (most recent last), evicting its oldest beyond capacity.

        Each endpoint's LRU is a plain dict in recency order (re-inserting moves a hash to the end): about half
        the cost of an ``OrderedDict`` under constant churn. Eviction runs once per call, after the inserts.
        """
        name = endpoint.name
        lru = self._lrus.get(name)
        if lru is None:
            lru = self._lrus[name] = {}
            gpu_blocks = endpoint.metrics.num_gpu_blocks
            self._capacity[name] = gpu_blocks if self._auto_tune and gpu_blocks else self._lru_capacity
        index = self._hash_to_eps
        pop = lru.pop
        for h in hashes:
            if pop(h, _ABSENT) is _ABSENT:
                holders = index.get(h)
                if holders is None:
                    index[h] = {name}
                else:
                    holders.add(name)
            lru[h] = None
        overflow = len(lru) - self._capacity[name]
        if overflow > 0:
            oldest = iter(lru)
            for h in [next(oldest) for _ in range(overflow)]:
                del lru[h]
                self._unlink(h, name)

    def _unlink(self, h: int, name: str) -> None:
        holders = self._hash_to_eps.get(h)
        if holders is not None:
            holders.discard(name)
            if not holders:
                del self._hash_to_eps[h]

    def remove_endpoint(self, name: str) -> None:
        """Forget everything indexed for endpoint ``name`` (it left the pool)."""
        lru = self._lrus.pop(name, None)
        self._capacity.pop(name, None)
        if lru is None:
            return
        for h in lru:
            self._unlink(h, name)

    def on_endpoints_changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        """A :class:`~epp.datalayer.datastore.Datastore` listener: forget endpoints that left the pool."""
        for ep in removed:
            self.remove_endpoint(ep.name)

    def indexed_endpoints(self) -> list[str]:
        """Names of the endpoints the index holds entries for."""
        return list(self._lrus)

    def capacity(self, name: str) -> int | None:
        """The LRU capacity (in blocks) of endpoint ``name``, once it has been indexed."""
        return self._capacity.get(name)

    def index_size(self) -> int:
        """Total entries over all endpoints' LRUs (the reference's prefix-cache size metric)."""
        return sum(len(lru) for lru in self._lrus.values())

    def stats(self) -> PrefixCacheStats:
        """A copy of the hit statistics."""
        st = self._stats
        return PrefixCacheStats(st.requests, st.matched_blocks, st.total_blocks, st.matched_tokens, st.total_tokens)


def producer_fields(params: Any) -> dict[str, Any]:
    """The producer parameters a consumer's ``params`` set explicitly, as raw YAML keys."""
    if isinstance(params, dict):
        aliases = {f.alias for f in PrefixCacheParams.model_fields.values()}
        return {k: v for k, v in params.items() if k in aliases}
    fields = params.model_fields_set & set(PRODUCER_FIELDS)
    return params.model_dump(by_alias=True, include=fields)


def find_prefix_producer(owner: Any, handle: Handle, via: str | None = None,
                         producer_name: str | None = None) -> PrefixMatchProducer:
    """The producer a consumer reads.

    ``producer_name`` (the consumer's ``prefixMatchInfoProducerName``, llm-d PR #1183) must name a configured
    ``approx-prefix-cache-producer`` or another prefix-match producer (``precise-prefix-cache-producer``): anything
    else is a ``ConfigError`` on that field, as the reference fails
    at start-up when no plugin produces the named match info. Without it: the producer behind plugin ``via`` (a
    producer or a consumer of one) if given and present, else the first ``approx-prefix-cache-producer``;
    ``ConfigError`` naming ``owner`` if there is none."""
    if producer_name:
        return _named_producer(owner, handle, producer_name)
    if via:
        named = handle.plugin(via)
        if isinstance(named, ApproxPrefixCacheProducer):
            return named
        inner = getattr(named, "producer", None)
        if isinstance(inner, ApproxPrefixCacheProducer):
            return inner
    found = handle.first_of_type(PRODUCER_TYPE)
    if not isinstance(found, ApproxPrefixCacheProducer):
        raise ConfigError(f"plugin '{owner.name}' (type: {owner.type_name}) needs an {PRODUCER_TYPE}, and none is "
                          f"configured", plugin=owner.name)
    return found


def _named_producer(owner: Any, handle: Handle, name: str) -> PrefixMatchProducer:
    """The producer plugin ``name``: an approximate one, or any other that stores a :class:`PrefixMatch` under its
    ``state_key`` (``produces_prefix_match``, e.g. ``precise-prefix-cache-producer``)."""
    named = handle.plugin(name)
    if isinstance(named, PrefixMatchProducer) and named.produces_prefix_match:
        return named
    what = "is not configured" if named is None else f"is a {named.type_name}, not a prefix-match producer"
    raise ConfigError(f"plugin '{owner.name}' (type: {owner.type_name}): {PRODUCER_NAME_FIELD} names plugin "
                      f"'{name}', which {what}", plugin=owner.name, field=PRODUCER_NAME_FIELD)


_check_producer: type[DataProducer] = ApproxPrefixCacheProducer
_check_pre: type[PreRequest] = ApproxPrefixCacheProducer
_check_shared: type[SharedBlockIndex] = ApproxPrefixCacheProducer
_check_metrics: type[PrefixIndexMetrics] = ApproxPrefixCacheProducer
_check_match: type[PrefixMatchProducer] = ApproxPrefixCacheProducer
