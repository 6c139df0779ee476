"""EndpointPickerConfig: the reference's YAML schema, loaded in two phases.

Phase 1 (:func:`load_raw`) parses YAML strictly into :class:`EndpointPickerConfig` (unknown fields are errors).
Phase 2 (:func:`build_pipeline`) instantiates plugins through the registry, applies the reference's defaulting
and wires profiles, the profile handler, producers, hooks, parsers, default data sources, endpoint discovery,
saturation detector and passive health into a :class:`Pipeline` (``requestHandler``, ``dataLayer`` and passive
health in :mod:`epp.config.wiring`; the document's models are :mod:`epp.config.schema`). Types are checked as the reference's strict JSON decoding
checks them, and references must name a plugin of the right kind. Every error is a
:class:`~epp.errors.ConfigError` naming the plugin, field and line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, TypeGuard

import orjson
from pydantic import ValidationError

from epp.config.describe import describe_pipeline
from epp.config.feature_gates import GATE_DEFAULTS, FeatureGateError, enabled_gates
from epp.config.locations import config_location
from epp.config.schema import (
    API_VERSIONS,
    ApiVersion,
    DataLayerSpec,
    DataSourceSpec,
    DiscoverySpec,
    EndpointPickerConfig,
    PluginRef,
    PluginSpec,
    ProfilePluginRef,
    ProfileSpec,
    RequestHandlerSpec,
)
from epp.config.wiring import (
    BuildContext,
    build_parser,
    build_profiles,
    check_profiles,
    discovery_plugin,
    inject_data_layer_defaults,
    is_picker,
    is_profile_handler,
    passive_health,
)
from epp.config.yaml_lines import SourceMap, load_yaml
from epp.datalayer.wiring import bind_polling_sources, is_data_source, is_extractor
from epp.errors import ConfigError
from epp.flowcontrol.build import load_flow_control
from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.controller import Policies
from epp.framework.plugins import (
    Admitter,
    DataProducer,
    Handle,
    PassiveHealth,
    Picker,
    Plugin,
    PreRequest,
    ProfileHandler,
    ResponseChunk,
    ResponseComplete,
    ResponseHeaderProcessor,
    ResponseStarted,
    SaturationDetector,
)
from epp.framework.registry import Registry, drop_null_fields
from epp.scheduling.scheduler import Scheduler, SchedulerProfile

__all__ = ["EndpointPickerConfig", "PluginSpec", "ProfilePluginRef", "ProfileSpec", "PluginRef", "DataSourceSpec",
           "DataLayerSpec", "DiscoverySpec", "RequestHandlerSpec", "Pipeline", "load_raw", "load_config",
           "build_pipeline", "config_error_text", "DEFAULT_CONFIG_TEXT", "API_VERSIONS", "ApiVersion", "FEATURE_GATES"]

FEATURE_GATES = frozenset(GATE_DEFAULTS)
"""Every known gate name (their defaults and syntax: :mod:`epp.config.feature_gates`)."""
DEFAULT_PICKER = "max-score-picker"
DEFAULT_HANDLER = "single-profile-handler"
DEFAULT_DETECTOR = "utilization-detector"
log = logging.getLogger(__name__)
_PREFIX_PRODUCER = "approx-prefix-cache-producer"
"""The producer a consumer's ``prefixMatchInfoProducerName`` stands in for (it may name another, e.g. precise)."""

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


@dataclass
class Pipeline:
    """Everything built from one config: the scheduler plus the plugins each request-path stage calls."""

    config: EndpointPickerConfig
    handle: Handle
    scheduler: Scheduler
    parser: Plugin
    saturation_detector: SaturationDetector
    pre_request: list[PreRequest] = field(default_factory=list)
    response_header: list[ResponseHeaderProcessor] = field(default_factory=list)
    response_started: list[ResponseStarted] = field(default_factory=list)
    response_chunk: list[ResponseChunk] = field(default_factory=list)
    response_complete: list[ResponseComplete] = field(default_factory=list)
    admitters: list[Admitter] = field(default_factory=list)
    feature_gates: frozenset[str] = frozenset()
    """The gates that are on, defaults included (:func:`epp.config.feature_gates.enabled_gates`): ask ``X in``."""
    flow_control: FlowControlConfig | None = None
    flow_policies: Policies | None = None
    """The flow-control policy refs resolved to plugins (with the flowControl gate on), for the admission layer."""
    discovery: Plugin | None = None
    """The endpoint discovery plugin ``dataLayer.discovery`` names (it replaces the command line's endpoint
    source), or None."""
    health: PassiveHealth | None = None
    """The passive-health plugin (the config's, else the default ``outlier-detector``), or None."""
    source: str = "<config>"
    source_config: EndpointPickerConfig | None = None
    """The document as loaded, before the defaults building added to ``config`` (what a reload compares with)."""
    text: str | None = None
    """The config file's text as loaded (:func:`load_config`); None for the default config or ``--config-text``."""

    def describe(self) -> str:
        """A human-readable resolved pipeline: profiles, plugins with resolved parameters and weights."""
        return describe_pipeline(self)


def load_raw(text: str, source: str = "<config>") -> tuple[EndpointPickerConfig, SourceMap]:
    """Phase 1: strict YAML -> :class:`EndpointPickerConfig`.

    Empty or whitespace-only text means the reference default; text that is not empty yet holds no document
    (only comments, or an explicit null) is an error, as it is more likely a mistake than a request for defaults.
    """
    if not text.lstrip("\ufeff").strip():
        text = DEFAULT_CONFIG_TEXT
    data, smap = load_yaml(text, source, owner=config_location)
    if data is None:
        raise ConfigError("the config holds no document (only comments or null); an empty file means the "
                          "default config", source=source, line=1)
    if not isinstance(data, dict):
        raise ConfigError("config must be a YAML mapping (an EndpointPickerConfig)", source=source, line=1)
    cfg = _validate(data, smap)
    for i, entry in enumerate(cfg.feature_gates):
        try:
            enabled_gates([entry])
        except FeatureGateError as exc:
            raise ConfigError(f"featureGates: {exc}", field="featureGates", source=source,
                              line=smap.line("featureGates", i)) from exc
    return cfg, smap


def load_config(path: str | Path | None, registry: Registry, gate_overrides: Sequence[str] = ()) -> Pipeline:
    """Load and build a UTF-8 config file; None means the reference's default configuration. ``gate_overrides``:
    see :func:`build_pipeline`."""
    if path is None:
        return build_pipeline(*load_raw(DEFAULT_CONFIG_TEXT, "<default>"), registry, gate_overrides)
    text = _read_text(Path(path))
    pipeline = build_pipeline(*load_raw(text, str(Path(path))), registry, gate_overrides)
    pipeline.text = text
    return pipeline


def config_error_text(exc: ConfigError) -> str:
    """``exc`` as ``check-config`` and ``serve`` print it: its message, plus the plugin it concerns when the
    message does not already name it."""
    text = str(exc)
    if exc.plugin and f"'{exc.plugin}'" not in text:
        text += f" (plugin '{exc.plugin}')"
    return text


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", source=str(path)) from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the config file is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                          source=str(path), line=raw.count(b"\n", 0, exc.start) + 1) from exc


def _validate(data: dict[str, Any], smap: SourceMap) -> EndpointPickerConfig:
    """``data`` -> :class:`EndpointPickerConfig`, typed as Go's ``encoding/json`` types it (strict JSON mode; a
    null field is left unset, as Go leaves it)."""
    try:
        return EndpointPickerConfig.model_validate_json(orjson.dumps(drop_null_fields(data, EndpointPickerConfig)),
                                                        strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err.get("loc", ()))
        what, plugin = config_location(data, loc)
        msg = f"{what} is not a known field" if err.get("type") == "extra_forbidden" else \
            f"{what}: {err.get('msg', 'invalid')}"
        raise ConfigError(msg, plugin=plugin, field=".".join(map(str, loc)) or None, source=smap.source,
                          line=smap.line(*loc)) from exc


def build_pipeline(cfg: EndpointPickerConfig, smap: SourceMap, registry: Registry,
                   gate_overrides: Sequence[str] = ()) -> Pipeline:
    """Phase 2: instantiate plugins, apply defaults, and wire everything into a :class:`Pipeline`.

    ``gate_overrides`` are ``--feature-gates`` entries: applied after the config's ``featureGates``, so they win
    (entries already checked by :func:`epp.config.feature_gates.parse_feature_gates`); the config itself is
    unchanged."""
    source_config = cfg.model_copy(deep=True)
    pipeline = _Builder(cfg, smap, registry, gate_overrides).build()
    pipeline.source_config = source_config
    return pipeline


class _Builder(BuildContext):
    """Phase 2 in order: the wiring steps (:mod:`epp.config.wiring`) and the slots each plugin fills."""

    def __init__(self, cfg: EndpointPickerConfig, smap: SourceMap, registry: Registry,
                 gate_overrides: Sequence[str] = ()) -> None:
        super().__init__(cfg, smap, registry, Handle())
        self.gates = enabled_gates([*cfg.feature_gates, *gate_overrides])

    def build(self) -> Pipeline:
        self._instantiate()
        self._auto_create_producers()
        self.shared_default("inflight-load-producer")  # in-flight load is always booked; declared or default estimate
        health = passive_health(self)  # on by default: a wedged server must not keep drawing traffic
        self._bind_all()
        inject_data_layer_defaults(self)
        self._check_data_layer_refs()
        parser, discovery = build_parser(self), discovery_plugin(self)
        profiles = build_profiles(self.cfg, self.smap, self.handle, self._default_picker)
        handler = self._profile_handler(profiles)
        plugins = self.handle.plugins()
        slot: Callable[[type], list[Any]] = lambda kind: [p for p in plugins if isinstance(p, kind)]  # noqa: E731
        scheduler = Scheduler(profiles, handler, slot(DataProducer))
        flow_control, flow_policies = load_flow_control(self.cfg.flow_control, self.gates, self.handle, self.error)
        return Pipeline(
            config=self.cfg, handle=self.handle, scheduler=scheduler,
            parser=parser, discovery=discovery, health=health,
            saturation_detector=self._saturation_detector(flow_control),
            pre_request=slot(PreRequest), response_header=slot(ResponseHeaderProcessor),
            response_started=slot(ResponseStarted), response_chunk=slot(ResponseChunk),
            response_complete=slot(ResponseComplete),
            admitters=slot(Admitter),
            feature_gates=self.gates,
            flow_control=flow_control,
            flow_policies=flow_policies,
            source=self.smap.source,
        )

    def _instantiate(self) -> None:
        for i, spec in enumerate(self.cfg.plugins):
            name = spec.name or spec.type
            if not spec.type:
                what = f"plugin '{name}'" if name else f"plugins[{i}]"
                raise self.error(f"{what} is missing a type", "plugins", i, plugin=name or None, fld="type")
            if self.handle.plugin(name) is not None:
                raise self.error(f"duplicate plugin name '{name}'", "plugins", i, plugin=name, fld="name")
            try:
                plugin = self.registry.create(spec.type, name, spec.parameters, self.handle)
            except ConfigError as exc:
                raise ConfigError(str(exc), plugin=name, field=exc.field, source=self.smap.source,
                                  line=self.smap.line(*self._spec_path(i, spec, exc.field))) from exc
            self.handle.add(plugin)

    def _spec_path(self, index: int, spec: PluginSpec, fld: str | None) -> tuple[str | int, ...]:
        """Where in ``plugins[index]`` an error from building it points: its type, a parameter, or the entry."""
        if spec.type not in self.registry:
            return ("plugins", index, "type")
        if fld:
            return ("plugins", index, "parameters", fld.split(".")[0])
        return ("plugins", index)

    def _auto_create_producers(self) -> None:
        """Create each producer some plugin consumes but the config does not declare, with the consumers'
        producer parameters merged (two consumers setting one parameter to different values is an error)."""
        wanted: dict[str, dict[str, Any]] = {}
        setters: dict[str, dict[str, str]] = {}  # producer type -> parameter -> the consumer that set it first
        for plugin in self.handle.plugins():
            params = getattr(plugin, "params", None)  # a consumer's parameters, when it has any
            for producer_type in getattr(plugin, "consumes", ()):
                named = getattr(params, "prefix_match_info_producer_name", None) \
                    if producer_type == _PREFIX_PRODUCER else None  # it names the prefix producer only
                if self.handle.first_of_type(self.registry.resolve(producer_type)) is not None or (
                        named and self.handle.plugin(named) is not None):  # it reads the producer it names
                    continue
                merged = wanted.setdefault(producer_type, {})
                given = setters.setdefault(producer_type, {})
                raw = plugin.producer_params(params) if hasattr(plugin, "producer_params") else {}
                for key, value in raw.items():
                    if key in merged and merged[key] != value:
                        raise self.error(f"plugins '{given[key]}' and '{plugin.name}' set {producer_type} parameter "
                                         f"'{key}' to different values ({merged[key]!r} vs {value!r})",
                                         *self._param_path(plugin.name, key), plugin=plugin.name, fld=key)
                    merged[key] = value
                    given.setdefault(key, plugin.name)
        for producer_type, raw in wanted.items():
            name = producer_type if self.handle.plugin(producer_type) is None else f"{producer_type}-auto"
            try:
                producer = self.registry.create(producer_type, name, raw, self.handle)
            except ConfigError as exc:
                reason = str(exc).removeprefix(f"plugin '{name}' (type: {producer_type}): ")
                raise self._auto_producer_error(producer_type, reason, exc.field, setters[producer_type]) from exc
            self.handle.add(producer)

    def _auto_producer_error(self, producer_type: str, reason: str, blamed: str | None,
                             setters: dict[str, str]) -> ConfigError:
        """The error for an auto-created producer its parameters made invalid, stated against the configured
        plugins that gave them (``setters``: parameter -> plugin) and pointing at the ``blamed`` parameter's line
        (else the first one given)."""
        what = f"the {producer_type} that EPP creates automatically (no plugin of that type is declared)"
        key = blamed.split(".")[0] if blamed and blamed.split(".")[0] in setters else next(iter(setters), None)
        if key is None:
            return self.error(f"{what} cannot be built: {reason}", "plugins", plugin=producer_type)
        culprits = list(dict.fromkeys([setters[key], *setters.values()]))
        who = f"plugin '{culprits[0]}'" if len(culprits) == 1 else \
            "plugins " + " and ".join(f"'{c}'" for c in culprits)
        given = "; ".join(f"'{k}' from plugin '{p}' at line {self.smap.line(*self._param_path(p, k))}"
                          for k, p in setters.items())
        return self.error(f"{who} gave {what} parameters it rejects: {reason} ({given})",
                          *self._param_path(setters[key], key), plugin=setters[key], fld=key)

    def _param_path(self, plugin_name: str, key: str) -> tuple[str | int, ...]:
        """The YAML path of parameter ``key`` of the configured plugin ``plugin_name`` (``plugins`` if it is not
        declared there); :meth:`SourceMap.line` falls back to the plugin entry when the key is not written."""
        for i, spec in enumerate(self.cfg.plugins):
            if (spec.name or spec.type) == plugin_name:
                return ("plugins", i, "parameters", key)
        return ("plugins",)

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
        """Each ``dataLayer`` source must name a declared data source and each extractor an extractor; then the
        polling sources (``models-data-source``) get their extractors."""
        layer = self.cfg.data_layer
        for i, src in enumerate(layer.sources if layer is not None else []):
            self.check_ref(src.plugin_ref, ("dataLayer", "sources", i, "pluginRef"), "a data source", is_data_source)
            for j, ext in enumerate(src.extractors):
                self.check_ref(ext.plugin_ref, ("dataLayer", "sources", i, "extractors", j, "pluginRef"),
                               "an extractor", is_extractor)
        try:
            bind_polling_sources(self.cfg, self.handle)
        except ConfigError as exc:
            path = tuple(int(p) if p.isdigit() else p for p in (exc.field or "dataLayer").split("."))
            raise self.error(str(exc), *path, plugin=exc.plugin, fld=exc.field) from exc

    def _default_picker(self, profile: str) -> Picker:
        """The picker of a profile that names none: the first picker declared in ``plugins`` (one instance shared
        across profiles), else a max-score-picker created once (the reference's ensureSchedulingLayer)."""
        declared = next((p for p in self.handle.plugins() if isinstance(p, Picker)), None)
        return declared or self.shared_default_of(DEFAULT_PICKER, "a picker", is_picker)

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
            handlers = [self.shared_default_of(DEFAULT_HANDLER, "a profile handler", is_profile_handler)]
        check_profiles(handlers[0], profiles, self.smap)
        return handlers[0]

    def _saturation_detector(self, flow_control: FlowControlConfig | None) -> SaturationDetector:
        """The detector ``flowControl.saturationDetector`` names (read with or without the flowControl gate, as it
        also serves the legacy admission), else the deprecated top-level ``saturationDetector``'s, else the default:
        the reference's precedence."""
        kind = "a saturation detector"
        ref = flow_control.saturation_detector.plugin_ref if flow_control and flow_control.saturation_detector else ""
        if ref:
            return self.check_ref(ref, ("flowControl", "saturationDetector", "pluginRef"), kind,
                                  _is_saturation_detector)
        if self.cfg.saturation_detector is not None:
            return self.check_ref(self.cfg.saturation_detector.plugin_ref, ("saturationDetector", "pluginRef"), kind,
                                  _is_saturation_detector)
        return self.shared_default_of(DEFAULT_DETECTOR, kind, _is_saturation_detector)


def _is_saturation_detector(plugin: Plugin) -> TypeGuard[SaturationDetector]:
    return isinstance(plugin, SaturationDetector)
