"""The KV-block index behind precise prefix-cache scoring: which endpoint holds which prompt block, learned from the
model servers' own KV-cache events (a dual-key design).

**Request keys** are EPP's own chained hash over full blocks of ``block_size`` token ids, seeded by the model (or
LoRA adapter) name and ``hash_seed``, with each block's extra keys (cache salt, image hashes: :mod:`.extra`) folded
in; a request's prompt ids and a ``BlockStored`` event's ``token_ids`` give the same keys, so EPP never needs the
engine's own block hashes. **Engine keys** are the hashes in the engine's events, each mapped to the request keys of
its tokens (also when the engine's block size differs). Each request key holds a small LRU of :class:`PodEntry`
(at most ``pod_cache_size``); the index holds at most ``size`` request keys, least recently used evicted first.
Everything runs on the event loop: no locks.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import xxhash

__all__ = ["PodEntry", "TokenProcessor", "KVBlockIndex", "IndexStats", "longest_prefix", "DEFAULT_TIER_WEIGHTS"]

DEFAULT_TIER_WEIGHTS: Mapping[str, float] = {"gpu": 1.0, "cpu": 0.8}
"""llm-d-kv-cache's default backend weights: a block in CPU memory is worth 0.8 of one on the GPU."""

_xxh = xxhash.xxh3_64_intdigest


@dataclass(frozen=True, slots=True)
class PodEntry:
    """One holder of a block: the endpoint id (``address:port``, or a bare address), its tier, whether the
    entry is a routing-time guess (speculative) rather than something the engine reported, and the engine's KV-cache
    group (vLLM's ``group_idx`` for hybrid models; None when the engine reports none). An endpoint holds a block
    while any of its entries is there."""

    pod: str
    tier: str = "gpu"
    speculative: bool = False
    group: int | None = None


class TokenProcessor:
    """Turns token ids into request keys (see the module doc). Immutable; safe to share."""

    def __init__(self, block_size: int = 16, hash_seed: str = "") -> None:
        if block_size < 1:
            raise ValueError(f"blockSize must be greater than 0, got {block_size}")
        self.block_size = block_size
        self._seed = _xxh(hash_seed.encode()).to_bytes(8, "little")

    def root(self, model: str) -> int:
        """The key a model's chains start from."""
        return _xxh(self._seed + model.encode())

    def keys(self, tokens: Sequence[int], model: str, parent: int | None = None, limit: int | None = None,
             extras: Sequence[Sequence[str] | None] | None = None) -> list[int]:
        """Request keys of the full blocks of ``tokens`` (at most ``limit`` blocks), chained from ``parent`` (else
        from the model's root); ``extras[i]`` are block i's extra keys (missing or empty: none). Raises
        ``OverflowError`` for an id outside 0..2^32-1."""
        size = self.block_size
        count = len(tokens) // size
        if limit is not None:
            count = min(count, limit)
        if count == 0:
            return []
        data = array("I", tokens[:count * size]).tobytes()
        prev = self.root(model) if parent is None else parent
        width = size * 4
        out: list[int] = []
        append = out.append
        if not extras:
            for off in range(0, count * width, width):
                prev = _xxh(prev.to_bytes(8, "little") + data[off:off + width])
                append(prev)
            return out
        for i in range(count):
            block = data[i * width:(i + 1) * width]
            extra = extras[i] if i < len(extras) else None
            prev = _xxh(prev.to_bytes(8, "little") + block + (_extra_bytes(extra) if extra else b""))
            append(prev)
        return out


def _extra_bytes(extra: Sequence[str]) -> bytes:
    """Each extra key as LE64(byte length) ‖ UTF-8 bytes."""
    parts = []
    for key in extra:
        raw = key.encode("utf-8", "surrogatepass")
        parts.append(len(raw).to_bytes(8, "little") + raw)
    return b"".join(parts)


@dataclass(slots=True)
class IndexStats:
    """Counters for EPP's metrics: admissions/evictions of (key, endpoint) entries, lookups, keys asked for, and
    keys found (per lookup, the longest run of keys one endpoint holds from the first, as llm-d counts hits)."""

    admissions: int = 0
    evictions: int = 0
    lookups: int = 0
    lookup_keys: int = 0
    lookup_hits: int = 0


class KVBlockIndex:
    """request key -> LRU of :class:`PodEntry`, plus engine key -> request key. See the module doc."""

    def __init__(self, size: int = 100_000_000, pod_cache_size: int = 10) -> None:
        if size < 1 or pod_cache_size < 1:
            raise ValueError("size and podCacheSize must be at least 1")
        self.size = size
        self.pod_cache_size = pod_cache_size
        self._data: OrderedDict[int, OrderedDict[PodEntry, None]] = OrderedDict()
        self._engine: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._by_pod: dict[str, set[int]] = {}
        self.stats = IndexStats()

    def __len__(self) -> int:
        return len(self._data)

    def add(self, request_keys: Sequence[int], entries: Iterable[PodEntry],
            engine_keys: Sequence[int] | None = None) -> None:
        """Record ``entries`` as holders of every request key; map ``engine_keys`` onto them (1:1, or by the ratio
        of the two lengths when the engine's block size differs) unless None (speculative entries)."""
        entries = list(entries)
        for key in request_keys:
            holders = self._data.get(key)
            if holders is None:
                holders = self._data[key] = OrderedDict()
                if len(self._data) > self.size:
                    self._drop_oldest_key()
            else:
                self._data.move_to_end(key)
            for entry in entries:
                if entry in holders:
                    holders.move_to_end(entry)
                    continue
                holders[entry] = None
                self._by_pod.setdefault(entry.pod, set()).add(key)
                self.stats.admissions += 1
                if len(holders) > self.pod_cache_size:
                    old, _ = holders.popitem(last=False)
                    self._unlink(old.pod, key, holders)
                    self.stats.evictions += 1
        if engine_keys:
            self._map_engine_keys(engine_keys, request_keys)

    def _map_engine_keys(self, engine_keys: Sequence[int], request_keys: Sequence[int]) -> None:
        """llm-d's proportional mapping: walk ``max(len)`` steps, pairing ``engine_keys[i*E//n]`` with
        ``request_keys[i*R//n]``, so each engine key gets the ordered request keys its tokens cover."""
        n_eng, n_req = len(engine_keys), len(request_keys)
        if n_req == 0:
            return
        n = max(n_eng, n_req)
        spans: dict[int, list[int]] = {}
        for i in range(n):
            rks = spans.setdefault(engine_keys[i * n_eng // n], [])
            rk = request_keys[i * n_req // n]
            if not rks or rks[-1] != rk:
                rks.append(rk)
        engine = self._engine
        for ek, rks in spans.items():
            engine[ek] = tuple(rks)
            engine.move_to_end(ek)
        while len(engine) > self.size:
            engine.popitem(last=False)

    def _drop_oldest_key(self) -> None:
        key, holders = self._data.popitem(last=False)
        for entry in holders:
            self._unlink(entry.pod, key, None)
        self.stats.evictions += len(holders)

    def _unlink(self, pod: str, key: int, holders: OrderedDict[PodEntry, None] | None) -> None:
        """Drop ``key`` from ``pod``'s key set unless ``holders`` still has another entry (tier) of ``pod``."""
        if holders is not None and any(e.pod == pod for e in holders):
            return
        keys = self._by_pod.get(pod)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_pod[pod]

    def request_keys(self, engine_key: int) -> tuple[int, ...]:
        """Every request key ``engine_key`` spans, in order (empty when unknown)."""
        return self._engine.get(engine_key, ())

    def request_key(self, engine_key: int) -> int | None:
        """The request key a chain continues from after ``engine_key`` (the last one it spans), if known."""
        rks = self._engine.get(engine_key)
        return rks[-1] if rks else None

    def evict(self, key: int, entries: Iterable[PodEntry], *, engine: bool) -> None:
        """Remove ``entries`` from ``key``: a request key, or (``engine``) every request key an engine key spans.
        A request key left without holders is dropped; so is an engine key none of whose request keys is held."""
        entries = tuple(entries)
        if not engine:
            self._evict_request_key(key, entries)
            return
        rks = self._engine.get(key)
        if rks is None:
            return
        for rk in rks:
            self._evict_request_key(rk, entries)
        if not any(rk in self._data for rk in rks):
            del self._engine[key]

    def _evict_request_key(self, rk: int, entries: tuple[PodEntry, ...]) -> None:
        holders = self._data.get(rk)
        if holders is None:
            return
        for entry in entries:
            if holders.pop(entry, _MISSING) is not _MISSING:
                self._unlink(entry.pod, rk, holders)
                self.stats.evictions += 1
        if not holders:
            del self._data[rk]

    def remove_pod(self, pod: str) -> int:
        """Forget every entry of endpoint ``pod`` (all tiers, speculative or not); returns how many were held."""
        removed = 0
        for key in self._by_pod.pop(pod, ()):
            holders = self._data.get(key)
            if holders is None:
                continue
            for entry in [e for e in holders if e.pod == pod]:
                del holders[entry]
                removed += 1
            if not holders:
                del self._data[key]
        self.stats.evictions += removed
        return removed

    def pods(self) -> list[str]:
        """Endpoint ids holding at least one block."""
        return list(self._by_pod)

    def lookup(self, request_keys: Sequence[int], pods: set[str] | None = None) -> list[list[PodEntry]]:
        """Holders of each key in order (only those whose ``pod`` is in ``pods`` when given), stopping after the
        first key nobody holds: a prefix-cache hit needs every block before it."""
        self.stats.lookups += 1
        self.stats.lookup_keys += len(request_keys)
        out: list[list[PodEntry]] = []
        data = self._data
        for key in request_keys:
            holders = data.get(key)
            if not holders:
                break
            out.append([e for e in holders if pods is None or e.pod in pods])
        self.stats.lookup_hits += _longest_chain(out)
        return out


def _longest_chain(per_key: Sequence[Sequence[PodEntry]]) -> int:
    """How many keys from the first the longest-holding single endpoint holds without a gap."""
    if not per_key:
        return 0
    alive = {e.pod for e in per_key[0]}
    length = 0
    for holders in per_key:
        alive &= {e.pod for e in holders}
        if not alive:
            break
        length += 1
    return length


def longest_prefix(per_key: Sequence[Sequence[PodEntry]],
                   weights: Mapping[str, float] = DEFAULT_TIER_WEIGHTS) -> tuple[dict[str, float], dict[str, int]]:
    """llm-d's LongestPrefix scoring over :meth:`KVBlockIndex.lookup` output: per endpoint id, the weighted count of
    consecutive blocks it holds from the first one (each block counts its best tier's weight; an unknown tier 1.0)
    and the plain count."""
    if not per_key:
        return {}, {}
    weighted: dict[str, float] = {}
    counts: dict[str, int] = {}
    active = _best_weights(per_key[0], weights)
    for pod, w in active.items():
        weighted[pod] = w
        counts[pod] = 1
    for holders in per_key[1:]:
        if not active:
            break
        best = _best_weights(holders, weights)
        active = {pod: w for pod, w in best.items() if pod in active}
        for pod, w in active.items():
            weighted[pod] += w
            counts[pod] += 1
    return weighted, counts


def _best_weights(holders: Sequence[PodEntry], weights: Mapping[str, float]) -> dict[str, float]:
    best: dict[str, float] = {}
    for entry in holders:
        w = weights.get(entry.tier, 1.0)
        if entry.pod not in best or w > best[entry.pod]:
            best[entry.pod] = w
    return best


_MISSING = object()
