"""Phase 2 of the config load: a :class:`BuildContext` (config, source lines, registry, handle) that the loader and
the hot reload share, the scheduling-profile steps, and for ``requestHandler`` and ``dataLayer`` the parser, the
default data sources and the endpoint discovery plugin, as the reference's loader resolves them.

Parsers: ``requestHandler.parsers``, else the deprecated top-level ``parser``, else ``openai-parser``; two or more
make a :class:`~epp.scheduling.parsers.ParserRegistry`, one is used as it is. Default data sources: unless
``dataLayer.injectDefaults`` is false, a ``metrics-data-source`` with a ``core-metrics-extractor`` is added when no
listed source is of that type. Discovery: ``dataLayer.discovery`` names the endpoint discovery plugin, which then
replaces the command line's endpoint source. Peer discovery and cross-replica sync are ConfigErrors naming the field.
Passive health: the config's one :class:`~epp.framework.plugins.PassiveHealth` plugin, else an ``outlier-detector``
with default parameters (when the registry has that type), so it is on by default; two are an error.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeGuard, TypeVar

from epp.config.schema import DataLayerSpec, DataSourceSpec, EndpointPickerConfig, PluginRef, ProfileSpec
from epp.config.yaml_lines import SourceMap
from epp.errors import ConfigError
from epp.framework.plugins import Filter, Handle, PassiveHealth, Picker, Plugin, ProfileHandler, Scorer
from epp.framework.registry import Registry
from epp.scheduling.parsers import ParserRegistry
from epp.scheduling.scheduler import SchedulerProfile, WeightedScorer

__all__ = ["BuildContext", "build_parser", "inject_data_layer_defaults", "discovery_plugin", "build_profiles",
           "check_profiles", "config_error", "is_parser", "is_discovery", "is_picker", "is_profile_handler",
           "passive_health", "DEFAULT_PARSER", "DEFAULT_HEALTH"]

log = logging.getLogger(__name__)

DEFAULT_PARSER = "openai-parser"
DEFAULT_HEALTH = "outlier-detector"
_METRICS_SOURCE = "metrics-data-source"
_METRICS_EXTRACTOR = "core-metrics-extractor"

K = TypeVar("K", bound=Plugin)
YamlPath = tuple[str | int, ...]


def config_error(smap: SourceMap, msg: str, *path: str | int, plugin: str | None = None,
                 fld: str | None = None) -> ConfigError:
    """A ConfigError citing the line of ``path`` in the document ``smap`` maps."""
    return ConfigError(msg, plugin=plugin, field=fld, source=smap.source, line=smap.line(*path))


def is_parser(plugin: Any) -> TypeGuard[Plugin]:
    """Whether ``plugin`` parses request bodies (``parse(path, body, headers)``)."""
    return callable(getattr(plugin, "parse", None))


def is_discovery(plugin: Any) -> TypeGuard[Plugin]:
    """Whether ``plugin`` is an endpoint discovery plugin (``discovery_service(datastore)``)."""
    return callable(getattr(plugin, "discovery_service", None))


def is_picker(plugin: Plugin) -> TypeGuard[Picker]:
    return isinstance(plugin, Picker)


def is_profile_handler(plugin: Plugin) -> TypeGuard[ProfileHandler]:
    return isinstance(plugin, ProfileHandler)


class BuildContext:
    """What the steps of phase 2 share while one config is built: the document (steps add defaults to it), its
    source map for error lines, the registry plugins are created from and the handle they are added to."""

    def __init__(self, cfg: EndpointPickerConfig, smap: SourceMap, registry: Registry, handle: Handle) -> None:
        self.cfg, self.smap, self.registry, self.handle = cfg, smap, registry, handle

    def error(self, msg: str, *path: str | int, plugin: str | None = None, fld: str | None = None) -> ConfigError:
        return config_error(self.smap, msg, *path, plugin=plugin, fld=fld)

    def shared_default(self, type_name: str) -> Plugin:
        """The first plugin of ``type_name``, else one created with default parameters, named by its type."""
        existing = self.handle.first_of_type(type_name)
        if existing is not None:
            return existing
        plugin = self.registry.create(type_name, type_name, None, self.handle)
        self.handle.add(plugin)
        return plugin

    def shared_default_of(self, type_name: str, kind: str, is_kind: Callable[[Plugin], TypeGuard[K]]) -> K:
        """:meth:`shared_default`, which must be ``kind`` (a registry mapping the type elsewhere is refused)."""
        plugin = self.shared_default(type_name)
        if not is_kind(plugin):
            raise self.error(f"the default plugin '{plugin.name}' (type: {type_name}) is not {kind}",
                             plugin=plugin.name)
        return plugin

    def check_ref(self, ref: str, path: YamlPath, kind: str, is_kind: Callable[[Plugin], TypeGuard[K]]) -> K:
        """The plugin ``ref`` names at ``path``; ConfigError if there is none or it is not ``kind``."""
        where = ".".join(map(str, path))
        plugin = self.handle.plugin(ref)
        if plugin is None:
            raise self.error(f"{where} references unknown plugin '{ref}'", *path, plugin=ref, fld=where)
        if not is_kind(plugin):
            raise self.error(f"{where}: cannot use plugin '{ref}' (type: {plugin.type_name}): it is not {kind}",
                             *path, plugin=ref, fld=where)
        return plugin


# -- parsers ---------------------------------------------------------------------------------------------------

def build_parser(b: BuildContext) -> Plugin:
    """The parser the request path calls (see the module docstring)."""
    refs = _parser_refs(b)
    if not refs:
        return b.shared_default(DEFAULT_PARSER)
    parsers = [_parser(b, ref, path) for ref, path in refs]
    if len(parsers) == 1:
        return parsers[0]
    registry = ParserRegistry(parsers)
    return registry.parsers[0] if len(registry.parsers) == 1 else registry


def _parser_refs(b: BuildContext) -> list[tuple[str, YamlPath]]:
    """Each configured parser ref with its YAML path: the list's, else the deprecated field's, else none."""
    handler, old = b.cfg.request_handler, b.cfg.parser
    if handler is not None and handler.propagate_priority:
        raise b.error("requestHandler.propagatePriority: EPP does not write the request priority into the "
                      "forwarded body; remove the field or set it to false", "requestHandler", "propagatePriority",
                      fld="requestHandler.propagatePriority")
    if handler is not None and handler.parsers:
        if old is not None:
            log.warning("%s:%s: the deprecated top-level parser '%s' is ignored: requestHandler.parsers is set "
                        "(the reference uses the new field when both are)", b.smap.source,
                        b.smap.line("parser"), old.plugin_ref)
        return [(p.plugin_ref, ("requestHandler", "parsers", i, "pluginRef")) for i, p in enumerate(handler.parsers)]
    return [] if old is None else [(old.plugin_ref, ("parser", "pluginRef"))]


def _parser(b: BuildContext, ref: str, path: YamlPath) -> Plugin:
    """The parser ``ref`` names: a declared plugin, else one created from the parser type of that name."""
    if b.handle.plugin(ref) is None and ref and ref in b.registry:
        if not is_parser(b.registry.plugin_class(ref)):
            where = ".".join(map(str, path))
            raise b.error(f"{where}: no plugin is named '{ref}', and plugin type '{ref}' is not a parser", *path,
                          plugin=ref, fld=where)
        b.handle.add(b.registry.create(ref, ref, None, b.handle))  # the reference's registerDefaultPlugin
    return b.check_ref(ref, path, "a parser", is_parser)


# -- data sources ----------------------------------------------------------------------------------------------

def inject_data_layer_defaults(b: BuildContext) -> None:
    """Add the default metrics source to ``dataLayer.sources`` unless ``injectDefaults`` is false or a listed
    source already is one (see the module docstring)."""
    layer = b.cfg.data_layer or DataLayerSpec()
    if layer.inject_defaults is False:
        return
    for src in layer.sources:
        plugin = b.handle.plugin(src.plugin_ref)
        if plugin is not None and plugin.type_name == _METRICS_SOURCE:
            return
    source, extractor = _default_plugin(b, _METRICS_SOURCE), _default_plugin(b, _METRICS_EXTRACTOR)
    injected = DataSourceSpec(plugin_ref=source.name, extractors=[PluginRef(plugin_ref=extractor.name)])
    b.cfg.data_layer = layer.model_copy(update={"sources": [*layer.sources, injected]})


def _default_plugin(b: BuildContext, type_name: str) -> Plugin:
    """The first declared plugin of ``type_name``, else a new one with default parameters."""
    declared = b.handle.first_of_type(type_name)
    if declared is not None:
        return declared
    name = type_name if b.handle.plugin(type_name) is None else f"{type_name}-default"
    plugin = b.registry.create(type_name, name, None, b.handle)
    b.handle.add(plugin)
    return plugin


# -- passive health --------------------------------------------------------------------------------------------

def passive_health(b: BuildContext) -> PassiveHealth | None:
    """The config's passive-health plugin, else a default ``outlier-detector`` added to the handle (None when the
    registry has no such type: an embedding program's own registry)."""
    found = [p for p in b.handle.plugins() if isinstance(p, PassiveHealth)]
    if len(found) > 1:
        names = ", ".join(f"'{p.name}'" for p in found)
        raise b.error(f"only one passive-health plugin is allowed, found {names}", "plugins", plugin=found[1].name)
    if found:
        return found[0]
    if DEFAULT_HEALTH not in b.registry:
        return None
    plugin = _default_plugin(b, DEFAULT_HEALTH)
    if not isinstance(plugin, PassiveHealth):
        raise b.error(f"the default plugin '{plugin.name}' (type: {DEFAULT_HEALTH}) is not a passive-health plugin",
                      plugin=plugin.name)
    return plugin


# -- discovery -------------------------------------------------------------------------------------------------

def discovery_plugin(b: BuildContext) -> Plugin | None:
    """The endpoint discovery plugin ``dataLayer.discovery`` names, or None; ConfigError for a field naming
    something EPP cannot serve (peer discovery, cross-replica sync)."""
    layer = b.cfg.data_layer
    if layer is None:
        return None
    _refuse_replica_fields(b, layer)
    spec = layer.discovery
    if spec is None:
        return None
    if spec.plugin_ref is not None and spec.endpoints is not None:
        raise b.error("dataLayer.discovery: give pluginRef (v1alpha1) or endpoints.pluginRef (v1), not both",
                      "dataLayer", "discovery", fld="dataLayer.discovery")
    path: YamlPath
    if spec.plugin_ref is not None:
        ref, path = spec.plugin_ref, ("dataLayer", "discovery", "pluginRef")
    elif spec.endpoints is not None:
        ref, path = spec.endpoints.plugin_ref, ("dataLayer", "discovery", "endpoints", "pluginRef")
    else:
        return None
    return b.check_ref(ref, path, "an endpoint discovery plugin (file-discovery)", is_discovery)


def _refuse_replica_fields(b: BuildContext, layer: DataLayerSpec) -> None:
    """ConfigError naming the first peer-discovery or cross-replica field that is set."""
    peers = layer.discovery.peers if layer.discovery is not None else None
    cross = layer.cross_replica
    given = [
        (peers is not None, ("dataLayer", "discovery", "peers"), "peer discovery"),
        (layer.peer_discovery is not None, ("dataLayer", "peerDiscovery"), "peer discovery"),
        (bool(layer.cross_replica_syncer_plugin_ref), ("dataLayer", "crossReplicaSyncerPluginRef"),
         "cross-replica state sync"),
        (layer.cross_replica_sync_interval is not None, ("dataLayer", "crossReplicaSyncInterval"),
         "cross-replica state sync"),
        (cross is not None and (bool(cross.syncer_plugin_ref) or cross.sync_interval is not None
                                or cross.publish_timeout is not None), ("dataLayer", "crossReplica"),
         "cross-replica state sync"),
    ]
    for is_set, path, what in given:
        if is_set:
            where = ".".join(path)
            raise b.error(f"{where}: EPP has no {what} between EPP replicas (each replica keeps its own state); "
                          f"remove the field", *path, fld=where)


# -- scheduling profiles ---------------------------------------------------------------------------------------

def build_profiles(cfg: EndpointPickerConfig, smap: SourceMap, handle: Handle,
                   default_picker: Callable[[str], Picker]) -> dict[str, SchedulerProfile]:
    """``schedulingProfiles`` over the plugins in ``handle`` (none listed: one ``default`` profile of every
    plugin); a profile naming no picker gets ``default_picker(profile name)``. Built alike at start-up and on a
    reload, which passes the start-up plugins and pickers."""
    specs = cfg.scheduling_profiles
    if not specs:
        prof = SchedulerProfile("default")
        for plugin in handle.plugins():
            _slot(smap, prof, plugin, None, ("plugins",))
        return {"default": _with_picker(prof, default_picker)}
    profiles: dict[str, SchedulerProfile] = {}
    for i, spec in enumerate(specs):
        if not spec.name:
            raise config_error(smap, f"schedulingProfiles[{i}] is missing a name", "schedulingProfiles", i,
                               fld="name")
        if spec.name in profiles:
            raise config_error(smap, f"duplicate scheduling profile '{spec.name}'", "schedulingProfiles", i, "name")
        profiles[spec.name] = _with_picker(_profile(smap, handle, i, spec), default_picker)
    return profiles


def check_profiles(handler: ProfileHandler, profiles: dict[str, SchedulerProfile], smap: SourceMap) -> None:
    """Let the profile handler refuse the profiles (``check_profiles``, when it has one), as a ConfigError at the
    ``schedulingProfiles`` line."""
    check = getattr(handler, "check_profiles", None)
    if check is None:
        return
    try:
        check(profiles)
    except ConfigError as exc:
        raise ConfigError(str(exc), plugin=handler.name, field=exc.field, source=smap.source,
                          line=smap.line("schedulingProfiles")) from exc


def _profile(smap: SourceMap, handle: Handle, index: int, spec: ProfileSpec) -> SchedulerProfile:
    prof = SchedulerProfile(spec.name)
    for j, ref in enumerate(spec.plugins):
        path = ("schedulingProfiles", index, "plugins", j)
        plugin = handle.plugin(ref.plugin_ref)
        if plugin is None:
            raise config_error(smap, f"profile '{spec.name}' references unknown plugin '{ref.plugin_ref}' "
                               "(pluginRef)", *path, "pluginRef", plugin=ref.plugin_ref, fld="pluginRef")
        if ref.weight is not None and not isinstance(plugin, Scorer):
            # The reference weights scorers only and ignores a weight given to anything else.
            log.warning("%s:%s: profile '%s': plugin '%s' (type: %s) is not a scorer, so its weight is ignored",
                        smap.source, smap.line(*path, "weight"), spec.name, plugin.name, plugin.type_name)
        _slot(smap, prof, plugin, ref.weight, path)
    return prof


def _slot(smap: SourceMap, prof: SchedulerProfile, plugin: Plugin, weight: float | None, path: YamlPath) -> None:
    if isinstance(plugin, Filter):
        prof.filters.append(plugin)
    if isinstance(plugin, Scorer):
        prof.scorers.append(WeightedScorer(plugin, 1.0 if weight is None else weight))
    if isinstance(plugin, Picker):
        if prof.picker is not None:
            raise config_error(smap, f"profile '{prof.name}' has two pickers: '{prof.picker.name}' and "
                               f"'{plugin.name}'", *path, plugin=plugin.name)
        prof.picker = plugin


def _with_picker(prof: SchedulerProfile, default_picker: Callable[[str], Picker]) -> SchedulerProfile:
    if prof.picker is None:
        prof.picker = default_picker(prof.name)
    return prof
