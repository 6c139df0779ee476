"""From a loaded configuration to a :class:`~epp.datalayer.scraper.Scraper` (the ``dataLayer`` section).

Building the config already added the default metrics source unless ``injectDefaults`` is false or one is listed,
so an empty ``sources`` list means metrics collection is off. A config not built by
:func:`epp.config.loader.build_pipeline` (no ``dataLayer``) scrapes with the declared or default
``metrics-data-source`` and ``core-metrics-extractor``. Otherwise each ``sources`` entry must reference a declared
data source (else a ConfigError); the single ``metrics-data-source`` entry drives the scraper. Polling sources
(``models-data-source``) are wired by :func:`bind_polling_sources`, each extractor to a source of its
``source_type``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeGuard

from epp.config.schema import EndpointPickerConfig, PluginRef
from epp.datalayer.scraper import EXTRACTOR_TYPE, SOURCE_TYPE, MetricsExtractor, ScrapeConfig, Scraper
from epp.errors import ConfigError
from epp.framework.plugins import Handle, Plugin
from epp.framework.registry import Registry

if TYPE_CHECKING:
    import aiohttp  # only for a type: the session is made by the caller

    from epp.datalayer.datastore import Datastore

__all__ = ["SOURCE_TYPE", "EXTRACTOR_TYPE", "scrape_settings", "build_scraper", "is_data_source", "is_extractor",
           "bind_polling_sources", "PollingSource"]

log = logging.getLogger(__name__)


class PollingSource(Protocol):
    """A data source that polls its endpoints itself and hands the responses to the extractors bound to it."""

    type_name: ClassVar[str]
    name: str

    def bind_extractor(self, extractor: Any) -> None:
        """Feed ``extractor`` this source's responses; ValueError if it is not made for this source's type."""
        ...


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


def is_data_source(plugin: Any) -> TypeGuard[Plugin]:
    """Whether ``plugin`` is a data source (the reference's ``DataSource``): it has ``scrape_config()``, it is a
    source of endpoint events (``endpoint_events``), or a polling source (``bind_extractor()``)."""
    return (callable(getattr(plugin, "scrape_config", None)) or bool(getattr(plugin, "endpoint_events", False))
            or callable(getattr(plugin, "bind_extractor", None)))


def is_extractor(plugin: Any) -> TypeGuard[Plugin]:
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
        if not _is_polling_source(source):
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


def _is_polling_source(plugin: Plugin | None) -> TypeGuard[PollingSource]:
    return callable(getattr(plugin, "bind_extractor", None))


def _bind_unlisted(handle: Handle, ext: Any, source_type: str) -> None:
    sources = [p for p in handle.plugins() if p.type_name == source_type and _is_polling_source(p)]
    if len(sources) == 1:
        sources[0].bind_extractor(ext)
        return
    why = "none is declared" if not sources else f"{len(sources)} are declared and no dataLayer source lists it"
    log.warning("datalayer: skipping unresolved dependency: extractor '%s' (type: %s) needs a %s, but %s; it "
                "stays unbound", ext.name, ext.type_name, source_type, why)


def _check_event_extractors(handle: Handle, source: Any, refs: list[PluginRef], index: int) -> None:
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
