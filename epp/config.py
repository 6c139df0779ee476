"""EndpointPickerConfig: the reference's YAML schema, loaded in two phases.

Phase 1 (:func:`load_raw`) parses YAML strictly into :class:`EndpointPickerConfig` (unknown fields are errors).
Phase 2 (:func:`build_pipeline`) instantiates plugins through the registry, applies the reference's defaulting
(see ``epp-reference.md`` §2) and wires profiles, the profile handler, producers, hooks, parser and saturation
detector into a :class:`Pipeline`. Every error is a :class:`~epp.errors.ConfigError` naming the plugin, field and
line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ConfigError
from .framework import (DataProducer, Filter, Handle, Picker, Plugin, PreRequest, ProfileHandler,
                        ResponseComplete, ResponseStarted, SaturationDetector, Scorer)
from .registry import Registry, format_validation_error
from .scheduler import Scheduler, SchedulerProfile, WeightedScorer
from .yamlsrc import SourceMap, load_yaml

__all__ = ["EndpointPickerConfig", "PluginSpec", "ProfilePluginRef", "ProfileSpec", "PluginRef", "DataSourceSpec",
           "DataLayerSpec", "Pipeline", "load_raw", "load_config", "build_pipeline", "DEFAULT_CONFIG_TEXT",
           "API_VERSIONS", "FEATURE_GATES"]

API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1")
FEATURE_GATES = frozenset({"dataLayer", "enableLegacyMetrics", "flowControl"})
DEFAULT_PICKER = "max-score-picker"
DEFAULT_HANDLER = "single-profile-handler"
DEFAULT_PARSER = "openai-parser"
DEFAULT_DETECTOR = "utilization-detector"

DEFAULT_CONFIG_TEXT = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""
"""The reference's configuration when none is given (queue 2, kv-cache 2, prefix 3)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PluginSpec(_Strict):
    type: str
    name: str | None = None
    parameters: dict[str, Any] | None = None


class ProfilePluginRef(_Strict):
    plugin_ref: str = Field(alias="pluginRef")
    weight: float | None = None


class ProfileSpec(_Strict):
    name: str
    plugins: list[ProfilePluginRef] = Field(default_factory=list)


class PluginRef(_Strict):
    plugin_ref: str = Field(alias="pluginRef")


class DataSourceSpec(_Strict):
    plugin_ref: str = Field(alias="pluginRef")
    extractors: list[PluginRef] = Field(default_factory=list)


class DataLayerSpec(_Strict):
    sources: list[DataSourceSpec] = Field(default_factory=list)


class EndpointPickerConfig(_Strict):
    """The whole YAML document, as the reference's ``EndpointPickerConfig`` type defines it."""

    api_version: Literal["inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1"] = Field(
        "inference.networking.x-k8s.io/v1alpha1", alias="apiVersion")
    kind: Literal["EndpointPickerConfig"] = "EndpointPickerConfig"
    feature_gates: list[str] = Field(default_factory=list, alias="featureGates")
    plugins: list[PluginSpec] = Field(default_factory=list)
    scheduling_profiles: list[ProfileSpec] = Field(default_factory=list, alias="schedulingProfiles")
    saturation_detector: PluginRef | None = Field(None, alias="saturationDetector")
    parser: PluginRef | None = None
    data_layer: DataLayerSpec | None = Field(None, alias="dataLayer")
    flow_control: dict[str, Any] | None = Field(None, alias="flowControl")


@dataclass
class Pipeline:
    """Everything built from one config: the scheduler plus the plugins each request-path stage calls."""

    config: EndpointPickerConfig
    handle: Handle
    scheduler: Scheduler
    parser: Plugin
    saturation_detector: SaturationDetector
    pre_request: list[PreRequest] = field(default_factory=list)
    response_started: list[ResponseStarted] = field(default_factory=list)
    response_complete: list[ResponseComplete] = field(default_factory=list)
    feature_gates: frozenset[str] = frozenset()
    flow_control: Any = None
    source: str = "<config>"

    def describe(self) -> str:
        """A human-readable resolved pipeline: profiles, plugins with resolved parameters and weights."""
        from .describe import describe_pipeline

        return describe_pipeline(self)


def load_raw(text: str, source: str = "<config>") -> tuple[EndpointPickerConfig, SourceMap]:
    """Phase 1: strict YAML -> :class:`EndpointPickerConfig`; an empty document means the reference default."""
    data, smap = load_yaml(text, source)
    if data is None:
        data, smap = load_yaml(DEFAULT_CONFIG_TEXT, source)
    if not isinstance(data, dict):
        raise ConfigError("config must be a YAML mapping (an EndpointPickerConfig)", source=source, line=1)
    try:
        cfg = EndpointPickerConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err.get("loc", ()))
        fld, msg = format_validation_error(exc, "field")
        raise ConfigError(f"field {msg}", field=fld, source=source, line=smap.line(*loc),
                          plugin=_plugin_at(data, loc)) from exc
    unknown = [g for g in cfg.feature_gates if g not in FEATURE_GATES]
    if unknown:
        raise ConfigError(f"unknown feature gate '{unknown[0]}' (known: {', '.join(sorted(FEATURE_GATES))})",
                          field="featureGates", source=source, line=smap.line("featureGates"))
    return cfg, smap


def load_config(path: str | Path | None, registry: Registry) -> Pipeline:
    """Load and build a config file; None means the reference's default configuration."""
    if path is None:
        return build_pipeline(*load_raw(DEFAULT_CONFIG_TEXT, "<default>"), registry)
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", source=str(p)) from exc
    return build_pipeline(*load_raw(text, str(p)), registry)


def build_pipeline(cfg: EndpointPickerConfig, smap: SourceMap, registry: Registry) -> Pipeline:
    """Phase 2: instantiate plugins, apply defaults, and wire everything into a :class:`Pipeline`."""
    return _Builder(cfg, smap, registry).build()


class _Builder:
    def __init__(self, cfg: EndpointPickerConfig, smap: SourceMap, registry: Registry) -> None:
        self.cfg, self.smap, self.registry = cfg, smap, registry
        self.handle = Handle()

    def error(self, msg: str, *path: str | int, plugin: str | None = None, fld: str | None = None) -> ConfigError:
        return ConfigError(msg, plugin=plugin, field=fld, source=self.smap.source, line=self.smap.line(*path))

    def build(self) -> Pipeline:
        self._instantiate()
        self._auto_create_producers()
        self._bind_all()
        self._check_data_layer_refs()
        profiles = self._profiles()
        handler = self._profile_handler(profiles)
        plugins = self.handle.plugins()
        scheduler = Scheduler(profiles, handler, [p for p in plugins if isinstance(p, DataProducer)])
        return Pipeline(
            config=self.cfg, handle=self.handle, scheduler=scheduler,
            parser=self._referenced_or_default(self.cfg.parser, "parser", DEFAULT_PARSER),
            saturation_detector=self._referenced_or_default(self.cfg.saturation_detector, "saturationDetector",
                                                            DEFAULT_DETECTOR),  # type: ignore[arg-type]
            pre_request=[p for p in plugins if isinstance(p, PreRequest)],
            response_started=[p for p in plugins if isinstance(p, ResponseStarted)],
            response_complete=[p for p in plugins if isinstance(p, ResponseComplete)],
            feature_gates=frozenset(self.cfg.feature_gates),
            flow_control=self._flow_control(),
            source=self.smap.source,
        )

    def _instantiate(self) -> None:
        for i, spec in enumerate(self.cfg.plugins):
            name = spec.name or spec.type
            if self.handle.plugin(name) is not None:
                raise self.error(f"duplicate plugin name '{name}'", "plugins", i, plugin=name, fld="name")
            try:
                plugin = self.registry.create(spec.type, name, spec.parameters, self.handle)
            except ConfigError as exc:
                line_path = ("plugins", i, "parameters", exc.field.split(".")[0]) if exc.field else ("plugins", i)
                raise ConfigError(str(exc), plugin=name, field=exc.field, source=self.smap.source,
                                  line=self.smap.line(*line_path)) from exc
            self.handle.add(plugin)

    def _auto_create_producers(self) -> None:
        """Create each producer some plugin consumes but the config does not declare, with the consumers'
        producer parameters merged (two consumers setting one parameter to different values is an error)."""
        wanted: dict[str, dict[str, Any]] = {}
        setters: dict[tuple[str, str], str] = {}
        for plugin in self.handle.plugins():
            for producer_type in getattr(plugin, "consumes", ()):
                if self.handle.first_of_type(self.registry.resolve(producer_type)) is not None:
                    continue
                merged = wanted.setdefault(producer_type, {})
                raw = plugin.producer_params(plugin.params) if hasattr(plugin, "producer_params") else {}
                for key, value in raw.items():
                    if key in merged and merged[key] != value:
                        raise self.error(f"plugins '{setters[producer_type, key]}' and '{plugin.name}' set "
                                         f"{producer_type} parameter '{key}' to different values "
                                         f"({merged[key]!r} vs {value!r})", "plugins", plugin=plugin.name, fld=key)
                    merged[key] = value
                    setters[producer_type, key] = plugin.name
        for producer_type, raw in wanted.items():
            name = producer_type if self.handle.plugin(producer_type) is None else f"{producer_type}-auto"
            self.handle.add(self.registry.create(producer_type, name, raw, self.handle))

    def _bind_all(self) -> None:
        for i, plugin in enumerate(self.handle.plugins()):
            bind = getattr(plugin, "bind", None)
            if bind is None:
                continue
            try:
                bind(self.handle)
            except ConfigError as exc:
                raise ConfigError(str(exc), plugin=plugin.name, field=exc.field, source=self.smap.source,
                                  line=self.smap.line("plugins", i)) from exc

    def _check_data_layer_refs(self) -> None:
        layer = self.cfg.data_layer
        for i, src in enumerate(layer.sources if layer is not None else []):
            refs = [(src.plugin_ref, ("dataLayer", "sources", i, "pluginRef"))]
            refs += [(e.plugin_ref, ("dataLayer", "sources", i, "extractors", j, "pluginRef"))
                     for j, e in enumerate(src.extractors)]
            for ref, path in refs:
                if self.handle.plugin(ref) is None:
                    raise self.error(f"dataLayer references unknown plugin '{ref}' (pluginRef)", *path,
                                     plugin=ref, fld="pluginRef")

    def _profiles(self) -> dict[str, SchedulerProfile]:
        specs = self.cfg.scheduling_profiles
        if not specs:
            return {"default": self._default_profile()}
        profiles: dict[str, SchedulerProfile] = {}
        for i, spec in enumerate(specs):
            if spec.name in profiles:
                raise self.error(f"duplicate scheduling profile '{spec.name}'", "schedulingProfiles", i, "name")
            profiles[spec.name] = self._profile(i, spec)
        return profiles

    def _default_profile(self) -> SchedulerProfile:
        prof = SchedulerProfile("default")
        for plugin in self.handle.plugins():
            self._slot(prof, plugin, None, ("plugins",))
        return self._with_picker(prof)

    def _profile(self, index: int, spec: ProfileSpec) -> SchedulerProfile:
        prof = SchedulerProfile(spec.name)
        for j, ref in enumerate(spec.plugins):
            path = ("schedulingProfiles", index, "plugins", j)
            plugin = self.handle.plugin(ref.plugin_ref)
            if plugin is None:
                raise self.error(f"profile '{spec.name}' references unknown plugin '{ref.plugin_ref}' (pluginRef)",
                                 *path, "pluginRef", plugin=ref.plugin_ref, fld="pluginRef")
            if ref.weight is not None and not isinstance(plugin, Scorer):
                raise self.error(f"profile '{spec.name}': plugin '{plugin.name}' (type: {plugin.type_name}) is not a "
                                 f"scorer, so it cannot have a weight", *path, "weight", plugin=plugin.name,
                                 fld="weight")
            self._slot(prof, plugin, ref.weight, path)
        return self._with_picker(prof)

    def _slot(self, prof: SchedulerProfile, plugin: Plugin, weight: float | None, path: tuple) -> None:
        if isinstance(plugin, Filter):
            prof.filters.append(plugin)
        if isinstance(plugin, Scorer):
            prof.scorers.append(WeightedScorer(plugin, 1.0 if weight is None else weight))
        if isinstance(plugin, Picker):
            if prof.picker is not None:
                raise self.error(f"profile '{prof.name}' has two pickers: '{prof.picker.name}' and '{plugin.name}'",
                                 *path, plugin=plugin.name)
            prof.picker = plugin

    def _with_picker(self, prof: SchedulerProfile) -> SchedulerProfile:
        if prof.picker is None:
            prof.picker = self._shared_default(DEFAULT_PICKER)  # type: ignore[assignment]
        return prof

    def _shared_default(self, type_name: str) -> Plugin:
        existing = self.handle.first_of_type(type_name)
        if existing is not None:
            return existing
        plugin = self.registry.create(type_name, type_name, None, self.handle)
        self.handle.add(plugin)
        return plugin

    def _profile_handler(self, profiles: dict[str, SchedulerProfile]) -> ProfileHandler:
        handlers = [p for p in self.handle.plugins() if isinstance(p, ProfileHandler)]
        if len(handlers) > 1:
            names = ", ".join(f"'{h.name}'" for h in handlers)
            raise self.error(f"only one profile handler is allowed, found {names}", "plugins",
                             plugin=handlers[1].name)
        if not handlers:
            if len(profiles) > 1:
                raise self.error("several scheduling profiles need a profile handler plugin "
                                 "(e.g. disagg-profile-handler)", "schedulingProfiles")
            handlers = [self._shared_default(DEFAULT_HANDLER)]  # type: ignore[list-item]
        handler = handlers[0]
        check = getattr(handler, "check_profiles", None)
        if check is not None:
            try:
                check(profiles)
            except ConfigError as exc:
                raise ConfigError(str(exc), plugin=handler.name, field=exc.field, source=self.smap.source,
                                  line=self.smap.line("schedulingProfiles")) from exc
        return handler

    def _referenced_or_default(self, ref: PluginRef | None, section: str, default_type: str) -> Plugin:
        if ref is None:
            return self._shared_default(default_type)
        plugin = self.handle.plugin(ref.plugin_ref)
        if plugin is None:
            raise self.error(f"{section} references unknown plugin '{ref.plugin_ref}'", section, "pluginRef",
                             plugin=ref.plugin_ref, fld="pluginRef")
        return plugin

    def _flow_control(self) -> Any:
        raw = self.cfg.flow_control
        if raw is None:
            return None
        from .flowcontrol.config import FlowControlConfig

        try:
            return FlowControlConfig.model_validate(raw)
        except ValidationError as exc:
            fld, msg = format_validation_error(exc, "field")
            loc = tuple(exc.errors()[0].get("loc", ()))
            raise self.error(f"flowControl: field {msg}", "flowControl", *loc, fld=fld) from exc


def _plugin_at(data: dict[str, Any], loc: tuple) -> str | None:
    if len(loc) >= 2 and loc[0] == "plugins" and isinstance(loc[1], int):
        plugins = data.get("plugins") or []
        if loc[1] < len(plugins) and isinstance(plugins[loc[1]], dict):
            spec = plugins[loc[1]]
            return spec.get("name") or spec.get("type")
    return None
