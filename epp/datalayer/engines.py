"""Engine metric mappings: which series carry each number for one model-server engine.

A :class:`MetricSpec` is a metric name with optional equality label matchers (the reference's spec syntax,
``name{label=value,...}``). An :class:`EngineConfig` lists, for each number EPP reads, the specs to try in order
(the first present on the page wins); :data:`BUILTIN_ENGINES` holds the configs of vLLM, SGLang, ATOM,
TensorRT-LLM serve, Triton TensorRT-LLM and Triton. :mod:`epp.datalayer.parsing` turns a page into
:class:`~epp.framework.endpoint.Metrics` with one of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["MetricSpec", "CustomMetric", "EngineConfig", "BUILTIN_ENGINES", "DEFAULT_ENGINE",
           "unescape_label_value"]

DEFAULT_ENGINE = "vllm"

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_SPEC_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,}\s]*))\s*(,?)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A metric family name plus equality label matchers, written ``name`` or ``name{k=v,k2="v2"}``."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> MetricSpec:
        """Parse the reference's spec syntax; ``ValueError`` if it is not ``name`` or ``name{k=v,...}``."""
        text = text.strip()
        m = _NAME_RE.match(text)
        if m is None:
            raise ValueError(f"invalid metric spec {text!r}: expected a metric name")
        name, rest = m.group(0), text[m.end():].strip()
        if not rest:
            return cls(name)
        if not (rest.startswith("{") and rest.endswith("}")):
            raise ValueError(f"invalid metric spec {text!r}: expected name{{label=value,...}}")
        labels, pos, body = [], 0, rest[1:-1]
        while pos < len(body):
            lm = _SPEC_LABEL_RE.match(body, pos)
            if lm is None or lm.end() == pos:
                raise ValueError(f"invalid metric spec {text!r}: bad label matcher at {body[pos:]!r}")
            value = lm.group(2) if lm.group(2) is not None else lm.group(3)
            labels.append((lm.group(1), unescape_label_value(value)))
            pos = lm.end()
        return cls(name, tuple(labels))

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True if every matcher's label has exactly its value in ``labels``."""
        return all(labels.get(k) == v for k, v in self.labels)

    def __str__(self) -> str:
        if not self.labels:
            return self.name
        return self.name + "{" + ",".join(f'{k}="{v}"' for k, v in self.labels) + "}"


def unescape_label_value(value: str) -> str:
    """Undo the exposition format's escapes (``\\\\``, ``\\"``, ``\\n``) in a label value."""
    if "\\" not in value:
        return value
    return re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], value)


def _specs(*texts: str) -> tuple[MetricSpec, ...]:
    return tuple(MetricSpec.parse(t) for t in texts)


@dataclass(frozen=True, slots=True)
class CustomMetric:
    """An engine's ``customMetrics`` entry: the scalar read by ``specs`` (first present wins) is stored under
    ``attribute_key`` in :attr:`Metrics.custom <epp.framework.endpoint.Metrics.custom>`; with ``label_name``, that label's
    value (a string) is stored in :attr:`Metrics.custom_labels <epp.framework.endpoint.Metrics.custom_labels>` instead.
    Missing from a page (or, with ``label_name``, the series lacking that label), it fails the scrape unless
    ``optional`` (then it is just absent from that scrape's metrics)."""

    attribute_key: str
    specs: tuple[MetricSpec, ...]
    optional: bool = False
    label_name: str = ""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Where one engine's numbers live. Each field lists alternatives (first present wins); empty = not read.

    ``queued``, ``running`` and ``kv_usage`` are required when configured: a page without them is a failed
    scrape (stale numbers must not look fresh). LoRA, cache info and the cache-geometry gauges are optional.
    ``cache_info`` is an info-style series whose labels carry the geometry: ``block_size_label`` and
    ``num_blocks_label`` when set, else ``block_size``/``num_gpu_blocks`` (vLLM) or ``page_size``/``num_pages``
    (SGLang); ``block_size``/``num_blocks`` are plain gauges (TensorRT-LLM, newer SGLang).

    LoRA: ``lora`` is the activity info series (``vllm:lora_requests_info``); ``lora_loaded`` the per-adapter
    residency gauge (labels ``adapter_name``, ``level``, ``pinned``, ``rank``), ``lora_gpu_loaded`` the count of
    adapters in GPU slots (label ``model_name``: the base model) and ``lora_gpu_slots`` the number of GPU slots
    (wins over ``lora``'s ``max_lora`` label). ``custom_metrics`` are extra scalars, required unless optional.
    """

    name: str
    queued: tuple[MetricSpec, ...] = ()
    running: tuple[MetricSpec, ...] = ()
    kv_usage: tuple[MetricSpec, ...] = ()
    lora: tuple[MetricSpec, ...] = ()
    cache_info: tuple[MetricSpec, ...] = ()
    block_size: tuple[MetricSpec, ...] = ()
    num_blocks: tuple[MetricSpec, ...] = ()
    block_size_label: str = ""
    num_blocks_label: str = ""
    lora_loaded: tuple[MetricSpec, ...] = ()
    lora_gpu_loaded: tuple[MetricSpec, ...] = ()
    lora_gpu_slots: tuple[MetricSpec, ...] = ()
    custom_metrics: tuple[CustomMetric, ...] = ()
    families: frozenset[str] = field(init=False)
    optional_families: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        keys = [c.attribute_key for c in self.custom_metrics]
        if len(set(keys)) != len(keys):
            raise ValueError(f"engine {self.name}: customMetrics attributeKey repeated in {keys}")
        names = {s.name for group in self._groups() for s in group}
        required_groups = (self.queued, self.running, self.kv_usage,
                           *(c.specs for c in self.custom_metrics if not c.optional))
        required = {s.name for group in required_groups for s in group}
        object.__setattr__(self, "families", frozenset(names))
        object.__setattr__(self, "optional_families", frozenset(names - required))

    def _groups(self) -> tuple[tuple[MetricSpec, ...], ...]:
        return (self.queued, self.running, self.kv_usage, self.lora, self.cache_info, self.block_size,
                self.num_blocks, self.lora_loaded, self.lora_gpu_loaded, self.lora_gpu_slots,
                *(c.specs for c in self.custom_metrics))


BUILTIN_ENGINES: dict[str, EngineConfig] = {
    "vllm": EngineConfig(
        "vllm",
        queued=_specs("vllm:num_requests_waiting"),
        running=_specs("vllm:num_requests_running"),
        # V1 name first; V0 (and the deprecated mirror V1 keeps until ~v0.11) second.
        kv_usage=_specs("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        lora=_specs("vllm:lora_requests_info"),
        cache_info=_specs("vllm:cache_config_info"),
        # GPU LoRA slots (vllm-project/vllm#54830; not in a tagged vLLM release yet), as the reference: they feed
        # max_lora, which lora-affinity-scorer reads. The reference also reads the per-adapter residency gauges
        # (vllm:lora_adapter_loaded, vllm:num_gpu_loaded_lora_adapters) by default; nothing in EPP reads those
        # yet, and looking for them costs time on every scrape, so they are read only when an engineConfigs
        # entry names them (loraLoadedSpec, loraGPULoadedSpec).
        lora_gpu_slots=_specs("vllm:max_gpu_lora_adapters"),
    ),
    "sglang": EngineConfig(
        "sglang",
        queued=_specs("sglang:num_queue_reqs"),
        running=_specs("sglang:num_running_reqs"),
        kv_usage=_specs("sglang:token_usage"),
        # Older SGLang: cache_config_info{page_size,num_pages}; newer: plain gauges (the reference reads only
        # these). A page has one or the other; the gauges win if both appear.
        cache_info=_specs("sglang:cache_config_info"),
        block_size=_specs("sglang:page_size"),
        num_blocks=_specs("sglang:num_pages"),
    ),
    "atom": EngineConfig(
        "atom", queued=_specs("atom:requests_waiting"), running=_specs("atom:requests_running"),
        kv_usage=_specs("atom:kv_cache_usage_ratio"), cache_info=_specs("atom:cache_config_info"),
    ),
    "trtllm-serve": EngineConfig(
        "trtllm-serve",
        queued=_specs("trtllm_num_requests_waiting"),
        running=_specs("trtllm_num_requests_running"),
        kv_usage=_specs("trtllm_kv_cache_utilization"),
        block_size=_specs("trtllm_kv_cache_tokens_per_block"),
        num_blocks=_specs("trtllm_kv_cache_max_blocks"),
    ),
    "triton-tensorrt-llm": EngineConfig(
        "triton-tensorrt-llm",
        queued=_specs('nv_trt_llm_request_metrics{request_type="waiting"}'),
        running=_specs('nv_trt_llm_request_metrics{request_type="scheduled"}'),
        kv_usage=_specs('nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}'),
        block_size=_specs('nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"}'),
        num_blocks=_specs('nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"}'),
    ),
    # Triton Inference Server without an LLM backend: no KV cache, so no KV usage or cache geometry.
    "triton": EngineConfig(
        "triton", queued=_specs("nv_inference_pending_request_count"), running=_specs("nv_inference_exec_count"),
    ),
}
