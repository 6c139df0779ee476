"""Endpoints (model-server ranks) and the metrics snapshot scheduling reads.

Consistency contract: a scheduling cycle is synchronous (no ``await`` inside), and the scraper replaces an
endpoint's :class:`Metrics` wholesale (the object is frozen). A cycle therefore reads one consistent snapshot of
every endpoint without copying anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["Metrics", "LoraLoadState", "EndpointSpec", "Endpoint", "ROLE_LABEL", "ENGINE_LABEL",
           "LEGACY_ENGINE_LABEL", "EMPTY_METRICS"]

ROLE_LABEL = "llm-d.ai/role"
ENGINE_LABEL = "llm-d.ai/engine-type"
"""The pod label naming a model server's engine (llm-d's current key, the extractor's default ``engineLabelKey``)."""
LEGACY_ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
"""The Inference Extension's engine key; the newest reference no longer reads it, nor does EPP (kept for tests)."""


@dataclass(frozen=True, slots=True)
class LoraLoadState:
    """Where one resident LoRA adapter lives (the reference's ``LoraLoadState``).

    ``level`` is ``"gpu"`` (in a GPU slot, ready to serve) or ``"cpu"`` (only in the host cache); ``pinned``
    means exempt from eviction; ``rank`` is the adapter's LoRA rank (0 = not reported).
    """

    level: str
    pinned: bool = False
    rank: int = 0


@dataclass(frozen=True, slots=True)
class Metrics:
    """One scrape of a model server. ``update_time`` is ``time.monotonic()`` of the scrape; 0 means never.

    LoRA *activity* (``vllm:lora_requests_info``): ``running_loras``, ``waiting_loras``, ``max_lora`` (GPU adapter
    slots; a ``loraGPUSlotsSpec`` gauge wins over the info label). LoRA *residency* (``loraLoadedSpec``,
    ``loraGPULoadedSpec``): ``loaded_loras`` maps every adapter held in the server's caches to its
    :class:`LoraLoadState` (None = the server does not report residency), ``gpu_loaded_loras`` counts those in
    GPU slots, ``base_model`` is the served base model. ``custom`` holds an engine's ``customMetrics`` by
    ``attributeKey`` (the reference stores them as endpoint attributes); a metric the page lacks is absent.
    ``custom_labels`` holds the ``customMetrics`` entries with a ``labelName``: that label's value, a string.
    """

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    running_loras: frozenset[str] = frozenset()
    waiting_loras: frozenset[str] = frozenset()
    max_lora: int = 0
    max_num_seqs: int | None = None
    update_time: float = 0.0
    loaded_loras: Mapping[str, LoraLoadState] | None = field(default=None, hash=False)
    gpu_loaded_loras: int = 0
    base_model: str = ""
    custom: Mapping[str, float] = field(default_factory=dict, hash=False)
    custom_labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    def age(self, now: float | None = None) -> float:
        """Seconds since the scrape (infinite if there never was one)."""
        if self.update_time <= 0:
            return float("inf")
        return (time.monotonic() if now is None else now) - self.update_time


EMPTY_METRICS = Metrics()


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """What discovery knows of an endpoint: identity, address, labels and where its metrics live."""

    name: str
    address: str
    port: int
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics_port: int | None = None
    metrics_path: str = "/metrics"
    engine: str | None = None
    scheme: str = "http"
    namespace: str = ""
    """The Pod's Kubernetes namespace, or an endpoints file entry's ``namespace`` ("" when it gives none)."""
    metrics_address: str | None = None
    """Host the metrics page is scraped from (endpoints file ``metricsHost``); None = ``address``."""
    node: str = ""
    """The Kubernetes node the endpoint runs on (the Pod's ``spec.nodeName``, an endpoints file entry's ``node``);
    "" when unknown. The scheduler extender groups endpoints by it."""

    @property
    def hostport(self) -> str:
        """``address:port`` (IPv6 addresses bracketed), the form routing headers carry."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"


class Endpoint:
    """A live endpoint: its spec, the latest :class:`Metrics`, health, and EPP's own in-flight counters.

    In-flight counters count requests (and their estimated tokens) EPP dispatched to this endpoint and has not
    yet seen finish; they let scorers see load before the next scrape. The Director books them with the
    ``inflight-load-producer``'s estimate (:class:`~epp.framework.plugins.InFlightAccounting`).

    ``attributes`` is the reference's per-endpoint attribute map (``GetAttributes()``): data-layer extractors
    store what they collect under a key (e.g. the served models, :mod:`epp.datalayer.models`) and readers look it
    up; it goes away with the endpoint. Values are replaced wholesale, never mutated in place.
    """

    __slots__ = ("spec", "name", "address", "port", "hostport", "labels", "metrics", "inflight_requests",
                 "inflight_tokens", "scrape_failures", "healthy", "attributes", "__weakref__")

    def __init__(self, spec: EndpointSpec, metrics: Metrics = EMPTY_METRICS) -> None:
        self.spec = spec
        self.name = spec.name
        self.address = spec.address
        self.port = spec.port
        self.hostport = spec.hostport
        self.labels = spec.labels
        self.metrics = metrics
        self.inflight_requests = 0
        self.inflight_tokens = 0
        self.scrape_failures = 0
        self.healthy = True
        self.attributes: dict[str, Any] = {}

    @property
    def role(self) -> str | None:
        """The ``llm-d.ai/role`` label (prefill, decode, both, ...), or None."""
        return self.labels.get(ROLE_LABEL)

    def add_inflight(self, tokens: int, requests: int = 1) -> None:
        """Count ``requests`` more requests (one by default) and ``tokens`` more estimated tokens in flight."""
        self.inflight_requests += requests
        self.inflight_tokens += tokens

    def release_inflight(self, tokens: int, requests: int = 1) -> None:
        """Undo :meth:`add_inflight` (never below zero); ``requests=0`` gives back tokens only."""
        self.inflight_requests = max(0, self.inflight_requests - requests)
        self.inflight_tokens = max(0, self.inflight_tokens - tokens)

    def __repr__(self) -> str:
        return f"Endpoint({self.name}@{self.hostport})"
