"""Phase 2 of the config load for ``requestHandler`` and ``dataLayer``: the parser, the default data sources and
the endpoint discovery plugin, as the reference's loader resolves them (llm-d-router ``pkg/epp/config/loader``).

- **Parsers.** ``requestHandler.parsers`` when it lists any, else the deprecated top-level ``parser`` (ignored,
  with a warning, beside a non-empty list: the reference's "the new field is used"), else ``openai-parser``. A
  ``pluginRef`` naming no declared plugin but a parser type creates that parser with its defaults, named by the
  type (the reference's ``ensureParsers``). Two or more usable parsers make a
  :class:`~epp.scheduling.parsers.ParserRegistry`; one is used as it is.
- **Default data sources** (the reference's ``ensureDataLayer``): unless ``dataLayer.injectDefaults`` is false,
  a ``metrics-data-source`` with a ``core-metrics-extractor`` is added to ``dataLayer.sources`` when no listed
  source is of that type, so a config listing only a models or KV-event source still scrapes metrics; the
  plugins declared in ``plugins:`` are used when there are some (first of each type), else ones with default
  parameters. The reference (since its v1 API) injects a ``models-data-source`` too; EPP does not, as nothing
  it routes with reads the served-model lists and polling ``/v1/models`` on every endpoint at every tick costs.
- **Discovery.** ``dataLayer.discovery.pluginRef`` (v1alpha1) or ``dataLayer.discovery.endpoints.pluginRef``
  (v1) names the endpoint discovery plugin (``file-discovery``), which then replaces the ``--endpoints`` /
  ``--pool-name`` / ``--endpoint-selector`` source. Peer discovery and cross-replica sync are refused with a
  ConfigError naming the field: EPP has neither.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from epp.config.schema import DataLayerSpec, DataSourceSpec, PluginRef
from epp.framework.plugins import Plugin
from epp.scheduling.parsers import ParserRegistry

if TYPE_CHECKING:
    from epp.config.loader import _Builder

__all__ = ["build_parser", "inject_data_layer_defaults", "discovery_plugin", "is_parser", "is_discovery",
           "DEFAULT_PARSER"]

log = logging.getLogger(__name__)

DEFAULT_PARSER = "openai-parser"
_METRICS_SOURCE = "metrics-data-source"
_METRICS_EXTRACTOR = "core-metrics-extractor"


def is_parser(plugin: Any) -> bool:
    """Whether ``plugin`` parses request bodies (``parse(path, body, headers)``)."""
    return callable(getattr(plugin, "parse", None))


def is_discovery(plugin: Any) -> bool:
    """Whether ``plugin`` is an endpoint discovery plugin (``discovery_service(datastore)``)."""
    return callable(getattr(plugin, "discovery_service", None))


# -- parsers ---------------------------------------------------------------------------------------------------

def build_parser(b: _Builder) -> Plugin:
    """The parser the request path calls (see the module docstring)."""
    refs = _parser_refs(b)
    if not refs:
        return b._shared_default(DEFAULT_PARSER)
    parsers = [_parser(b, ref, path) for ref, path in refs]
    if len(parsers) == 1:
        return parsers[0]
    registry = ParserRegistry(parsers)
    return registry.parsers[0] if len(registry.parsers) == 1 else registry  # type: ignore[return-value]


def _parser_refs(b: _Builder) -> list[tuple[str, tuple[str | int, ...]]]:
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


def _parser(b: _Builder, ref: str, path: tuple[str | int, ...]) -> Plugin:
    """The parser ``ref`` names: a declared plugin, else one created from the parser type of that name."""
    if b.handle.plugin(ref) is None and ref and ref in b.registry:
        if not is_parser(b.registry.plugin_class(ref)):
            where = ".".join(map(str, path))
            raise b.error(f"{where}: no plugin is named '{ref}', and plugin type '{ref}' is not a parser", *path,
                          plugin=ref, fld=where)
        b.handle.add(b.registry.create(ref, ref, None, b.handle))  # the reference's registerDefaultPlugin
    return b._check_ref(ref, path, "a parser", is_parser)


# -- data sources ----------------------------------------------------------------------------------------------

def inject_data_layer_defaults(b: _Builder) -> None:
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
    injected = DataSourceSpec(pluginRef=source.name, extractors=[PluginRef(pluginRef=extractor.name)])
    b.cfg.data_layer = layer.model_copy(update={"sources": [*layer.sources, injected]})


def _default_plugin(b: _Builder, type_name: str) -> Plugin:
    """The first declared plugin of ``type_name``, else a new one with default parameters."""
    declared = b.handle.first_of_type(type_name)
    if declared is not None:
        return declared
    name = type_name if b.handle.plugin(type_name) is None else f"{type_name}-default"
    plugin = b.registry.create(type_name, name, None, b.handle)
    b.handle.add(plugin)
    return plugin


# -- discovery -------------------------------------------------------------------------------------------------

def discovery_plugin(b: _Builder) -> Plugin | None:
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
    if spec.plugin_ref is not None:
        ref, path = spec.plugin_ref, ("dataLayer", "discovery", "pluginRef")
    elif spec.endpoints is not None:
        ref, path = spec.endpoints.plugin_ref, ("dataLayer", "discovery", "endpoints", "pluginRef")
    else:
        return None
    return b._check_ref(ref, path, "an endpoint discovery plugin (file-discovery)", is_discovery)


def _refuse_replica_fields(b: _Builder, layer: DataLayerSpec) -> None:
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
