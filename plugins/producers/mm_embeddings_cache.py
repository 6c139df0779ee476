"""``mm-embeddings-cache-producer``: which endpoint likely still holds a request's images, audio and video in vLLM's
multimodal encoder (embeddings) cache.

It models each endpoint's encoder cache from what EPP sent there (vLLM's ``EncoderCacheManager`` rule: referenced
entries are pinned, freed ones evicted oldest first); ``mm-embeddings-cache-scorer`` turns its match into scores,
and the config loader creates it for a scorer that needs it. A request's items are its ``mm_features`` hashes (from
a render), else hashes of the media parts of its messages. After a pick (:meth:`~MmEmbeddingsCacheProducer.pre_request`)
the items are acquired on the ``encode`` profile's endpoints, else on the primary target; the first response byte
commits them, and a request that ends without one commits nothing. The match stored in the cycle state (under
:attr:`~MmEmbeddingsCacheProducer.state_key`) lists, per endpoint name, the request items its model holds.

YAML::

    - type: mm-embeddings-cache-producer
      parameters:
        cacheSizeInEmbeddingsPerServer: 8192   # or cacheSizeInMBPerServer: 4096 (not both)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Iterator

from pydantic import Field

from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import (
    CycleState,
    DataProducer,
    Handle,
    PreRequest,
    ResponseComplete,
    ResponseInfo,
    ResponseStarted,
    SchedulingResult,
)
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

__all__ = ["MmEmbeddingsCacheProducer", "MatchItem", "EncoderCacheMatch", "EncoderCacheModel", "PRODUCER_TYPE",
           "ENCODE_PROFILE", "DEFAULT_CACHE_SIZE_MB", "extract_items", "content_hash", "capacity_from_mb",
           "encoding_targets", "find_mm_producer"]

PRODUCER_TYPE = "mm-embeddings-cache-producer"
ENCODE_PROFILE = "encode"
"""The profile whose endpoints run the encoder under E/PD disaggregation (llm-d hard-codes it too)."""
DEFAULT_CACHE_SIZE_MB = 4096
_MIB = 1024 * 1024
_BYTES_PER_ITEM = 2 * _MIB  # llm-d's fixed assumption per tracked item in the MiB mode


@dataclass(frozen=True, slots=True)
class MatchItem:
    """One unique multimodal item of a request: its hash, its weight (placeholder tokens, or 1) and modality."""

    hash: str
    size: int
    modality: str


@dataclass(slots=True)
class EncoderCacheMatch:
    """The producer's answer for one request: its items, and per endpoint name the items that endpoint holds."""

    items: tuple[MatchItem, ...]
    matched: dict[str, tuple[MatchItem, ...]] = field(default_factory=dict)

    @property
    def total_size(self) -> int:
        return sum(item.size for item in self.items)

    def matched_size(self, endpoint_name: str) -> int:
        return sum(item.size for item in self.matched.get(endpoint_name, ()))

    def score(self, endpoint_name: str) -> float:
        """``matched size / total size`` of the request's items; 0 when the total is not positive."""
        total = self.total_size
        return self.matched_size(endpoint_name) / total if total > 0 else 0.0


def capacity_from_mb(mb: int) -> int:
    """Entries per endpoint for a MiB budget: ``mb MiB / 2 MiB``, at least 1; ``mb <= 0`` means 4096."""
    if mb <= 0:
        mb = DEFAULT_CACHE_SIZE_MB
    return max(1, mb * _MIB // _BYTES_PER_ITEM)


def content_hash(kind: str, identifier: str) -> str:
    """Hex SHA-256 of ``kind ‖ 0x00 ‖ identifier``: an item's hash when no tokenizer reported vLLM's."""
    return hashlib.sha256(f"{kind}\x00{identifier}".encode("utf-8", "surrogatepass")).hexdigest()


def extract_items(request: InferenceRequest) -> list[MatchItem]:
    """The request's unique multimodal items, in order (see the module doc); [] for a text-only request."""
    seen: dict[str, MatchItem] = {}
    if request.mm_features:
        for feature in request.mm_features:
            if feature.hash and feature.hash not in seen:
                seen[feature.hash] = MatchItem(feature.hash, max(1, feature.length), feature.modality)
        return list(seen.values())
    for part in _media_parts(request.body):
        found = _part_item(part)
        if found is not None and found.hash not in seen:
            seen[found.hash] = found
    return list(seen.values())


def _media_parts(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every content part (a dict) of the messages in ``messages`` and ``input``."""
    for key in ("messages", "input"):
        messages = body.get(key)
        if not isinstance(messages, list):
            continue
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                yield from (part for part in content if isinstance(part, dict))


def _part_item(part: dict[str, Any]) -> MatchItem | None:
    """The item of one content part, checked in llm-d's order (image, video, audio URL, inline audio), else
    an Anthropic image block; None for a text (or unknown) part."""
    for kind, modality in (("image_url", "image"), ("video_url", "video"), ("audio_url", "audio")):
        url = _url(part.get(kind))
        if url:
            return MatchItem(content_hash(kind, url), 1, modality)
    audio = part.get("input_audio")
    if isinstance(audio, dict) and isinstance(audio.get("data"), str) and audio["data"]:
        fmt = audio.get("format") if isinstance(audio.get("format"), str) else ""
        return MatchItem(content_hash("input_audio", f"{fmt}:{audio['data']}"), 1, "audio")
    if part.get("type") == "image":
        url = _anthropic_image_url(part.get("source"))
        if url:
            return MatchItem(content_hash("image_url", url), 1, "image")
    return None


def _url(value: Any) -> str:
    """A part's URL: ``{"url": ...}`` (chat) or the string itself (Responses ``input_image``)."""
    if isinstance(value, dict):
        value = value.get("url")
    return value if isinstance(value, str) else ""


def _anthropic_image_url(source: Any) -> str:
    """The URL vLLM makes of an Anthropic image source: its ``url``, or a base64 ``data:`` URL."""
    if not isinstance(source, dict):
        return ""
    if source.get("type") == "url":
        return _url(source)
    data, media = source.get("data"), source.get("media_type")
    if isinstance(data, str) and data and isinstance(media, str):
        return f"data:{media};base64,{data}"
    return ""


@dataclass(slots=True)
class _Entry:
    size: int
    refs: set[str]


class EncoderCacheModel:
    """One endpoint's encoder cache as EPP models it: sized entries, pinned while requests reference them, and
    unreferenced entries evicted oldest-freed first (vLLM's ``EncoderCacheManager``). Not thread-safe: call it from
    the event loop only."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: dict[str, _Entry] = {}
        self._freeable: dict[str, int] = {}  # insertion order = the order entries lost their last reference
        self._used = 0
        self._freeable_size = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, item_hash: object) -> bool:
        return item_hash in self._entries

    def acquire(self, request_id: str, item: MatchItem) -> bool:
        """Reference ``item`` for ``request_id``, adding it if room can be made; False (nothing changed) when it
        does not fit beside the pinned entries."""
        entry = self._entries.get(item.hash)
        if entry is None:
            if not self._make_room(item.size):
                return False
            entry = self._entries[item.hash] = _Entry(item.size, set())
            self._used += item.size
        elif not entry.refs:
            self._freeable_size -= self._freeable.pop(item.hash)
        entry.refs.add(request_id)
        return True

    def release(self, request_id: str, item_hash: str) -> None:
        """Drop ``request_id``'s reference; an entry left unreferenced becomes the newest freeable one."""
        entry = self._entries.get(item_hash)
        if entry is None or request_id not in entry.refs:
            return
        entry.refs.discard(request_id)
        if not entry.refs:
            self._freeable[item_hash] = entry.size
            self._freeable_size += entry.size

    def commit(self, item: MatchItem) -> None:
        """Add ``item`` unreferenced (its encoder output was computed) if room can be made; no-op if present."""
        if item.hash in self._entries or not self._make_room(item.size):
            return
        self._entries[item.hash] = _Entry(item.size, set())
        self._used += item.size
        self._freeable[item.hash] = item.size
        self._freeable_size += item.size

    def _make_room(self, size: int) -> bool:
        """Evict the oldest freeable entries until ``size`` fits; False (evicting nothing) if it never can."""
        if size > self.capacity - self._used + self._freeable_size:
            return False
        while self.capacity - self._used < size:
            oldest = next(iter(self._freeable))
            freed = self._freeable.pop(oldest)
            del self._entries[oldest]
            self._used -= freed
            self._freeable_size -= freed
        return True


@dataclass(slots=True)
class _Placement:
    """What one routed request holds on one endpoint: acquired hashes, and items waiting for room."""

    endpoint: str
    acquired: list[str] = field(default_factory=list)
    pending: list[MatchItem] = field(default_factory=list)


class MmEmbeddingsCacheProducer:
    """Matches each multimodal request against per-endpoint encoder-cache models and records where it went."""

    type_name: ClassVar[str] = PRODUCER_TYPE

    class Params(PluginParams):
        cache_size_in_mb_per_server: int = Field(0, alias="cacheSizeInMBPerServer")
        cache_size_in_embeddings_per_server: int = Field(0, alias="cacheSizeInEmbeddingsPerServer")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        mb, embeddings = params.cache_size_in_mb_per_server, params.cache_size_in_embeddings_per_server
        if mb > 0 and embeddings > 0:
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): cacheSizeInMBPerServer and "
                              f"cacheSizeInEmbeddingsPerServer cannot both be set", plugin=name,
                              field="cacheSizeInEmbeddingsPerServer")
        self.name = name
        self.params = params
        self.state_key = f"{PRODUCER_TYPE}/{name}"
        self.use_item_size = embeddings > 0
        """True in the embeddings mode: entries take their item's size; else every entry takes one slot."""
        self.capacity = embeddings if self.use_item_size else capacity_from_mb(mb)
        self._caches: dict[str, EncoderCacheModel] = {}
        self._placements: dict[str, list[_Placement]] = {}  # request id -> what it holds until its first byte

    def produce(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        """Store the request's :class:`EncoderCacheMatch` under :attr:`state_key` (nothing for a text request)."""
        items = tuple(extract_items(request))
        if items:
            cycle[self.state_key] = EncoderCacheMatch(items, self._match(items, endpoints))

    def _match(self, items: tuple[MatchItem, ...], endpoints: list[Endpoint]) -> dict[str, tuple[MatchItem, ...]]:
        matched: dict[str, tuple[MatchItem, ...]] = {}
        for ep in endpoints:
            cache = self._caches.get(ep.name)
            if cache is not None:
                held = tuple(item for item in items if item.hash in cache)
                if held:
                    matched[ep.name] = held
        return matched

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """Acquire the request's items on the endpoints that will encode them (see the module doc)."""
        state = result.cycle.get(self.state_key)
        items = state.items if isinstance(state, EncoderCacheMatch) else tuple(extract_items(request))
        targets = encoding_targets(result)
        if not items or not targets:
            return
        self._finish(request.request_id, commit=False)  # a reused request id must not keep the old pins
        self._placements[request.request_id] = [self._acquire(request.request_id, ep.name, items) for ep in targets]

    def _acquire(self, request_id: str, endpoint: str, items: Iterable[MatchItem]) -> _Placement:
        cache = self._caches.get(endpoint)
        if cache is None:
            cache = self._caches[endpoint] = EncoderCacheModel(self.capacity)
        placement = _Placement(endpoint)
        for item in items:
            item = MatchItem(item.hash, max(1, item.size) if self.use_item_size else 1, item.modality)
            if cache.acquire(request_id, item):
                placement.acquired.append(item.hash)
            else:
                placement.pending.append(item)
        return placement

    def response_started(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        """The first response byte: the encoders ran, so release the references and commit pending items."""
        self._finish(request.request_id, commit=True)

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, info: ResponseInfo) -> None:
        """The request ended; if no byte came back its references are released and nothing pending is kept."""
        self._finish(request.request_id, commit=False)

    def _finish(self, request_id: str, *, commit: bool) -> None:
        for placement in self._placements.pop(request_id, ()):
            cache = self._caches.get(placement.endpoint)
            if cache is None:  # the endpoint left the pool meanwhile
                continue
            for item_hash in placement.acquired:
                cache.release(request_id, item_hash)
            if commit:
                for item in placement.pending:
                    cache.commit(item)

    def remove_endpoint(self, name: str) -> None:
        """Forget endpoint ``name`` (it left the pool); requests still pinning items there hold nothing."""
        self._caches.pop(name, None)

    def holds(self, endpoint_name: str, item_hash: str) -> bool:
        """Whether the model of ``endpoint_name`` holds ``item_hash`` (pinned or freeable)."""
        cache = self._caches.get(endpoint_name)
        return cache is not None and item_hash in cache

    def item_counts(self) -> dict[str, int]:
        """Items held per endpoint name, most first (llm-d's state dump, without the hashes)."""
        counts = {name: len(cache) for name, cache in self._caches.items()}
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def encoding_targets(result: SchedulingResult) -> list[Endpoint]:
    """The endpoints that encode the request's media: every endpoint the ``encode`` profile chose, else the primary
    target (its other endpoints are fallbacks, which get the request only if the target fails)."""
    encode = result.profile_results.get(ENCODE_PROFILE)
    if encode is not None and encode.endpoints:
        return list(encode.endpoints)
    return result.endpoints[:1]


def find_mm_producer(owner: Any, handle: Handle, producer_name: str | None) -> MmEmbeddingsCacheProducer:
    """The producer a consumer reads: the plugin ``producer_name`` (which must be an ``mm-embeddings-cache-producer``,
    a ConfigError on ``producerName`` otherwise), else the first one configured (ConfigError naming ``owner`` when
    there is none; the config loader creates one for a consumer that lists it in ``consumes``)."""
    if producer_name:
        named = handle.plugin(producer_name)
        if isinstance(named, MmEmbeddingsCacheProducer):
            return named
        what = "is not configured" if named is None else f"is a {named.type_name}, not an {PRODUCER_TYPE}"
        raise ConfigError(f"plugin '{owner.name}' (type: {owner.type_name}): producerName names plugin "
                          f"'{producer_name}', which {what}", plugin=owner.name, field="producerName")
    found = handle.first_of_type(PRODUCER_TYPE)
    if not isinstance(found, MmEmbeddingsCacheProducer):
        raise ConfigError(f"plugin '{owner.name}' (type: {owner.type_name}) needs an {PRODUCER_TYPE}, and none is "
                          f"configured", plugin=owner.name)
    return found


_check_producer: type[DataProducer] = MmEmbeddingsCacheProducer
_check_pre: type[PreRequest] = MmEmbeddingsCacheProducer
_check_started: type[ResponseStarted] = MmEmbeddingsCacheProducer
_check_complete: type[ResponseComplete] = MmEmbeddingsCacheProducer
