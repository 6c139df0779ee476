"""From a loaded configuration to a :class:`~epp.datalayer.scraper.Scraper` (the ``dataLayer`` section).

Rules, as the reference's loader applies them:

- building the config added the default metrics source to ``dataLayer.sources`` unless ``dataLayer.injectDefaults``
  is false or a source of that type is listed (:func:`epp.config.wiring.inject_data_layer_defaults`), so an empty
  list here means metrics collection is off (no scraper): ``injectDefaults: false`` with no metrics source;
- ``dataLayer`` absent (a config not built by :func:`epp.config.loader.build_pipeline`): scrape with the
  ``metrics-data-source`` and ``core-metrics-extractor`` declared in ``plugins:`` if any, built with default
  parameters otherwise;
- otherwise each ``sources`` entry must reference a declared data source (a plugin with ``scrape_config()``;
  anything else is a ConfigError, not a silently skipped entry). The (single) ``metrics-data-source`` entry
  drives the scraper, with its ``core-metrics-extractor`` extractor (default parameters if it lists none).
  Data sources of other types (``endpoint-notification-source`` for KV events) belong to other subsystems and
  are skipped here, once their extractors are checked to be endpoint-event consumers.

Polling sources other than the metrics scraper (``models-data-source``, a plugin with ``bind_extractor``) are
wired by :func:`bind_polling_sources` when the config is built: each listed extractor must be made for the
source's type (its ``source_type``), and an extractor no ``dataLayer`` source lists is bound to the one source of
its ``source_type`` when there is exactly one (else it stays unbound, with a warning), as the reference resolves
an extractor's source dependency.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from epp.errors import ConfigError

from epp.datalayer.scraper import EXTRACTOR_TYPE, SOURCE_TYPE, MetricsExtractor, ScrapeConfig, Scraper

if TYPE_CHECKING:
    import aiohttp

    from epp.config.loader import EndpointPickerConfig
    from epp.datalayer.datastore import Datastore
    from epp.framework.plugins import Handle
    from epp.framework.registry import Registry

__all__ = ["SOURCE_TYPE", "EXTRACTOR_TYPE", "scrape_settings", "build_scraper", "is_data_source", "is_extractor",
           "bind_polling_sources"]

log = logging.getLogger(__name__)

def scrape_settings(config: EndpointPickerConfig, handle: Handle,
                    registry: Registry) -> tuple[ScrapeConfig, MetricsExtractor] | None:
    """The scrape configuration and extractor the config asks for, or None if collection is off."""
    layer = config.data_layer
    if layer is None:
        source = handle.first_of_type(SOURCE_TYPE) or registry.create(SOURCE_TYPE, SOURCE_TYPE, None, handle)
        extractor = handle.first_of_type(EXTRACTOR_TYPE) or _default_extractor(handle, registry)
        return _settings(source, extractor)
    chosen: tuple[Any, Any] | None = None
    for i, src in enumerate(layer.sources):
        plugin = _referenced(handle, src.plugin_ref, f"dataLayer.sources.{i}.pluginRef")
        if not is_data_source(plugin):
            raise ConfigError(f"dataLayer.sources.{i}.pluginRef: plugin '{plugin.name}' (type: {plugin.type_name}) "
                              f"is not a data source", plugin=plugin.name, field=f"dataLayer.sources.{i}.pluginRef")
        if plugin.type_name != SOURCE_TYPE:
            _check_event_extractors(handle, plugin, src.extractors, i)
            continue
        if chosen is not None:
            raise ConfigError(f"dataLayer: only one {SOURCE_TYPE} source is supported, found "
                              f"'{chosen[0].name}' and '{plugin.name}'", plugin=plugin.name, field="dataLayer")
        extractors = [_referenced(handle, e.plugin_ref, f"dataLayer.sources.{i}.extractors.{j}.pluginRef")
                      for j, e in enumerate(src.extractors)]
        for ext in extractors:
            if ext.type_name != EXTRACTOR_TYPE:
                raise ConfigError(f"dataLayer: source '{plugin.name}' ({SOURCE_TYPE}) cannot use extractor "
                                  f"'{ext.name}' (type: {ext.type_name}); it needs a {EXTRACTOR_TYPE}",
                                  plugin=ext.name, field="dataLayer")
        if len(extractors) > 1:
            raise ConfigError(f"dataLayer: source '{plugin.name}' lists {len(extractors)} {EXTRACTOR_TYPE} "
                              f"extractors; one is supported", plugin=plugin.name, field="dataLayer")
        chosen = (plugin, extractors[0] if extractors else _default_extractor(handle, registry))
    return None if chosen is None else _settings(*chosen)


def build_scraper(config: EndpointPickerConfig, handle: Handle, registry: Registry, datastore: Datastore, *,
                  session: aiohttp.ClientSession | None = None) -> Scraper | None:
    """A (not yet started) :class:`Scraper` for ``datastore`` per the config, or None if collection is off."""
    settings = scrape_settings(config, handle, registry)
    if settings is None:
        return None
    scrape_config, extractor = settings
    return Scraper(datastore, scrape_config, extractor, session=session)


def is_data_source(plugin: Any) -> bool:
    """Whether ``plugin`` is a data source (the reference's ``DataSource``): it has ``scrape_config()``, it is a
    source of endpoint events (``endpoint_events``), or a polling source (``bind_extractor()``)."""
    return (callable(getattr(plugin, "scrape_config", None)) or bool(getattr(plugin, "endpoint_events", False))
            or callable(getattr(plugin, "bind_extractor", None)))


def is_extractor(plugin: Any) -> bool:
    """Whether ``plugin`` is an extractor (the reference's ``Extractor``): it has ``extractor()``, it consumes
    endpoint events (``consumes_endpoint_events``), or a polling source's responses (``source_type``)."""
    return (callable(getattr(plugin, "extractor", None)) or bool(getattr(plugin, "consumes_endpoint_events", False))
            or bool(getattr(plugin, "source_type", "")))


def bind_polling_sources(config: EndpointPickerConfig, handle: Handle) -> None:
    """Bind extractors to the polling sources (see the module docstring); ConfigError naming the extractor and its
    ``dataLayer`` field when a source cannot use it."""
    listed: set[str] = set()
    for i, src in enumerate(config.data_layer.sources if config.data_layer is not None else []):
        source = handle.plugin(src.plugin_ref)
        if not callable(getattr(source, "bind_extractor", None)):
            continue
        for j, ref in enumerate(src.extractors):
            where = f"dataLayer.sources.{i}.extractors.{j}.pluginRef"
            ext = _referenced(handle, ref.plugin_ref, where)
            try:
                source.bind_extractor(ext)
            except ValueError as exc:
                raise ConfigError(f"dataLayer: source '{source.name}' ({source.type_name}) cannot use extractor "
                                  f"'{ext.name}' (type: {ext.type_name}); {exc}", plugin=ext.name,
                                  field=where) from exc
            listed.add(ext.name)
    for ext in handle.plugins():
        wanted = getattr(ext, "source_type", "")
        if wanted and ext.name not in listed:
            _bind_unlisted(handle, ext, wanted)


def _bind_unlisted(handle: Handle, ext: Any, source_type: str) -> None:
    sources = [p for p in handle.plugins() if p.type_name == source_type]
    if len(sources) == 1:
        sources[0].bind_extractor(ext)
        return
    why = "none is declared" if not sources else f"{len(sources)} are declared and no dataLayer source lists it"
    log.warning("datalayer: skipping unresolved dependency: extractor '%s' (type: %s) needs a %s, but %s; it "
                "stays unbound", ext.name, ext.type_name, source_type, why)


def _check_event_extractors(handle: Handle, source: Any, refs: list[Any], index: int) -> None:
    """Each extractor of an endpoint-event source must consume endpoint events (ConfigError naming it)."""
    if not getattr(source, "endpoint_events", False):
        return
    for j, ref in enumerate(refs):
        where = f"dataLayer.sources.{index}.extractors.{j}.pluginRef"
        ext = _referenced(handle, ref.plugin_ref, where)
        if not getattr(ext, "consumes_endpoint_events", False):
            raise ConfigError(f"dataLayer: source '{source.name}' ({source.type_name}) cannot use extractor "
                              f"'{ext.name}' (type: {ext.type_name}); it takes plugins that consume endpoint events "
                              f"(precise-prefix-cache-producer)", plugin=ext.name, field=where)


def _referenced(handle: Handle, ref: str, where: str) -> Any:
    plugin = handle.plugin(ref)
    if plugin is None:
        raise ConfigError(f"{where} references unknown plugin '{ref}'", plugin=ref, field=where)
    return plugin


def _default_extractor(handle: Handle, registry: Registry) -> Any:
    return handle.first_of_type(EXTRACTOR_TYPE) or registry.create(EXTRACTOR_TYPE, EXTRACTOR_TYPE, None, handle)


def _settings(source: Any, extractor: Any) -> tuple[ScrapeConfig, MetricsExtractor]:
    return source.scrape_config(), extractor.extractor()
