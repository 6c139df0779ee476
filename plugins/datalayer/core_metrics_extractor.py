"""``core-metrics-extractor``: which series hold queue depth, running requests, KV usage, LoRA and cache info.

Built-in engines: ``vllm`` (V1, falling back to V0 names), ``sglang``, ``atom``, ``trtllm-serve``,
``triton-tensorrt-llm``, ``triton``. An endpoint's engine is its ``engineLabelKey`` label, else the static file's
``engine``, else ``defaultEngine``. An ``engineConfigs`` entry fully replaces the built-in of the same name; new
names add engines. A spec is a metric name with optional equality label matchers, or a list of specs tried in order
(the first present on the page wins). A custom metric the page lacks fails the scrape unless it is ``optional``.

YAML::

    plugins:
    - type: core-metrics-extractor
      parameters:
        defaultEngine: vllm
        engineConfigs:
        - name: my-engine
          queuedRequestsSpec: my_queue_size
          runningRequestsSpec: my_running
          kvUsageSpec: [my_kv_usage, my_kv_usage_legacy]
          loraSpec: ""                                   # not read
          loraLoadedSpec: my_lora_loaded                 # residency: labels adapter_name, level, pinned, rank
          loraGPULoadedSpec: my_gpu_loaded_loras         # adapters in GPU slots (label model_name: base model)
          loraGPUSlotsSpec: my_max_gpu_loras             # GPU adapter slots; wins over loraSpec's max_lora
          cacheInfoSpec: my_cache_info                   # labels block_size/num_gpu_blocks (or page_size/num_pages)
          cacheBlockSizeLabelName: page                  # ... or these labels of cacheInfoSpec
          cacheNumBlocksLabelName: pages
          cacheBlockSizeSpec: 'my_cache{kind="tokens_per_block"}'   # cache geometry as plain gauges
          cacheNumBlocksSpec: 'my_cache{kind="max_blocks"}'
          customMetrics:                                 # extra scalars -> Metrics.custom[attributeKey]
          - {attributeKey: queue_depth, metricSpec: 'my_queue_depth{tier=gold}'}
          - {attributeKey: nixl_failed, metricSpec: my_nixl_failed_total, optional: true}
          - {attributeKey: compat_hash, metricSpec: my_config_info, labelName: hash}   # a label -> custom_labels
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from epp.datalayer.engines import BUILTIN_ENGINES, DEFAULT_ENGINE, CustomMetric, EngineConfig, MetricSpec
from epp.datalayer.scraper import MetricsExtractor
from epp.framework.endpoint import ENGINE_LABEL
from epp.framework.plugins import Handle
from epp.framework.plugins import Params as PluginParams

__all__ = ["CoreMetricsExtractor", "EngineConfigParams", "CustomMetricParams"]

_RESERVED_ENGINE = "default"
_LABEL_NAME = r"^([a-zA-Z_][a-zA-Z0-9_]*)?$"  # a Prometheus label name, or "" for the default names


def _spec_list(value: str | list[str]) -> tuple[MetricSpec, ...]:
    items = [value] if isinstance(value, str) else value
    return tuple(MetricSpec.parse(s) for s in items if s.strip())


class CustomMetricParams(BaseModel):
    """One ``customMetrics`` entry: the scalar ``metricSpec`` reads (or, with ``labelName``, that label of its
    series, a string), stored under ``attributeKey``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    attribute_key: str = Field(alias="attributeKey", min_length=1)
    metric_spec: str | list[str] = Field(alias="metricSpec")
    optional: bool = False
    label_name: str = Field("", alias="labelName", pattern=_LABEL_NAME)

    @field_validator("metric_spec")
    @classmethod
    def _valid_spec(cls, v: str | list[str]) -> str | list[str]:
        if not _spec_list(v):  # raises ValueError naming a bad spec
            raise ValueError("metricSpec cannot be empty")
        return v

    def custom_metric(self) -> CustomMetric:
        """The parsed :class:`~epp.datalayer.engines.CustomMetric`."""
        return CustomMetric(self.attribute_key, _spec_list(self.metric_spec), self.optional, self.label_name)


class EngineConfigParams(BaseModel):
    """One ``engineConfigs`` entry; every spec is a string or list of strings ("" = not read)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    name: str = Field(min_length=1)
    queued_requests_spec: str | list[str] = Field("", alias="queuedRequestsSpec")
    running_requests_spec: str | list[str] = Field("", alias="runningRequestsSpec")
    kv_usage_spec: str | list[str] = Field("", alias="kvUsageSpec")
    lora_spec: str | list[str] = Field("", alias="loraSpec")
    lora_loaded_spec: str | list[str] = Field("", alias="loraLoadedSpec")
    lora_gpu_loaded_spec: str | list[str] = Field("", alias="loraGPULoadedSpec")
    lora_gpu_slots_spec: str | list[str] = Field("", alias="loraGPUSlotsSpec")
    cache_info_spec: str | list[str] = Field("", alias="cacheInfoSpec")
    cache_block_size_label_name: str = Field("", alias="cacheBlockSizeLabelName", pattern=_LABEL_NAME)
    cache_num_blocks_label_name: str = Field("", alias="cacheNumBlocksLabelName", pattern=_LABEL_NAME)
    cache_block_size_spec: str | list[str] = Field(
        "", validation_alias=AliasChoices("cacheBlockSizeSpec", "blockSizeSpec", "cache_block_size_spec"))
    cache_num_blocks_spec: str | list[str] = Field(
        "", validation_alias=AliasChoices("cacheNumBlocksSpec", "numBlocksSpec", "cache_num_blocks_spec"))
    custom_metrics: list[CustomMetricParams] = Field(default_factory=list, alias="customMetrics")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v == _RESERVED_ENGINE:
            raise ValueError(f"engine config name cannot be {_RESERVED_ENGINE!r} (reserved)")
        return v

    @field_validator("queued_requests_spec", "running_requests_spec", "kv_usage_spec", "lora_spec",
                     "lora_loaded_spec", "lora_gpu_loaded_spec", "lora_gpu_slots_spec", "cache_info_spec",
                     "cache_block_size_spec", "cache_num_blocks_spec")
    @classmethod
    def _valid_spec(cls, v: str | list[str]) -> str | list[str]:
        _spec_list(v)  # raises ValueError naming the bad spec
        return v

    @field_validator("custom_metrics")
    @classmethod
    def _unique_keys(cls, v: list[CustomMetricParams]) -> list[CustomMetricParams]:
        keys = [c.attribute_key for c in v]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise ValueError(f"customMetrics attributeKey repeated: {', '.join(repeated)}")
        return v

    def engine_config(self) -> EngineConfig:
        """The parsed :class:`EngineConfig`."""
        return EngineConfig(
            self.name, queued=_spec_list(self.queued_requests_spec),
            running=_spec_list(self.running_requests_spec), kv_usage=_spec_list(self.kv_usage_spec),
            lora=_spec_list(self.lora_spec), cache_info=_spec_list(self.cache_info_spec),
            block_size=_spec_list(self.cache_block_size_spec), num_blocks=_spec_list(self.cache_num_blocks_spec),
            block_size_label=self.cache_block_size_label_name, num_blocks_label=self.cache_num_blocks_label_name,
            lora_loaded=_spec_list(self.lora_loaded_spec), lora_gpu_loaded=_spec_list(self.lora_gpu_loaded_spec),
            lora_gpu_slots=_spec_list(self.lora_gpu_slots_spec),
            custom_metrics=tuple(c.custom_metric() for c in self.custom_metrics))


class CoreMetricsExtractor:
    """Engine metric mappings for the scraper (see the module docstring for the YAML)."""

    type_name: ClassVar[str] = "core-metrics-extractor"

    class Params(PluginParams):
        engine_label_key: str = Field(ENGINE_LABEL, alias="engineLabelKey")
        default_engine: str = Field(DEFAULT_ENGINE, alias="defaultEngine")
        engine_configs: list[EngineConfigParams] = Field(default_factory=list, alias="engineConfigs")

        @field_validator("engine_label_key", "default_engine", "engine_configs", mode="before")
        @classmethod
        def _empty_is_default(cls, v: object, info: ValidationInfo) -> object:
            """``""`` or null means the default, as the reference's factory fills unset fields."""
            if v is None or v == "":
                defaults = {"engine_label_key": ENGINE_LABEL, "default_engine": DEFAULT_ENGINE}
                return defaults.get(info.field_name or "", [])
            return v

    def __init__(self, name: str, params: Params, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params
        engines = dict(BUILTIN_ENGINES)
        seen: set[str] = set()
        for entry in params.engine_configs:
            if entry.name in seen:
                raise ValueError(f"engineConfigs: engine {entry.name!r} is configured twice")
            seen.add(entry.name)
            engines[entry.name] = entry.engine_config()
        if params.default_engine not in engines:
            raise ValueError(f"defaultEngine {params.default_engine!r} not found in engineConfigs or the built-in "
                             f"engines ({', '.join(sorted(engines))})")
        self.engines = engines

    def extractor(self) -> MetricsExtractor:
        """A :class:`MetricsExtractor` with these engines, default engine and label key."""
        return MetricsExtractor(self.engines, self.params.default_engine, self.params.engine_label_key)
