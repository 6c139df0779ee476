"""Live endpoint state: discovery (static file, Kubernetes), metrics scraping and parsing, served-models polling.

Wiring (what ``epp serve`` does)::

    datastore = Datastore(pool_name)
    discovery = StaticFileDiscovery(path, datastore)   # or KubernetesDiscovery(datastore, namespace=..., ...)
    scraper = build_scraper(pipeline.config, pipeline.handle, registry, datastore)   # None if collection is off
    await discovery.start()          # readiness = datastore.synced.is_set() once discovery has synced
    if scraper: await scraper.start()
    ...
    if scraper: await scraper.stop()
    await discovery.stop()

HA mode (``--ha-enable-leader-election``): a :class:`LeaderElector` campaigns for a Lease around the server, and
readiness additionally needs ``is_leader``.
"""

from epp.datalayer.engines import BUILTIN_ENGINES, DEFAULT_ENGINE, CustomMetric, EngineConfig, MetricSpec
from epp.datalayer.http import HttpError, MetricsHttpClient
from epp.datalayer.kubernetes import (
                         KubernetesDiscovery,
                         PoolSpec,
                         WatchOptions,
                         discovery_from_options,
                         make_api_client,
                         parse_selector,
                         pod_endpoints,
)
from epp.datalayer.leader import LeaderElector, lease_name_for
from epp.datalayer.models import (
                         MODELS_ATTRIBUTE_KEY,
                         ModelData,
                         ModelsParseError,
                         ModelsResponse,
                         parse_models,
                         stored_models,
)
from epp.datalayer.parsing import (
                         MetricsExtractError,
                         MetricsParseError,
                         ScanState,
                         parse_targeted,
                         parse_with_prometheus_client,
)
from epp.datalayer.polling import HttpPoller, PollConfig, TlsOptionError, tls_client_context
from epp.datalayer.scraper import DataLayerErrors, MetricsExtractor, ScrapeConfig, ScrapeError, Scraper, ScrapeStats
from epp.datalayer.static import (
                         EndpointsDocument,
                         StaticFileDiscovery,
                         load_endpoints_file,
                         parse_endpoints,
                         parse_endpoints_document,
)
from epp.datalayer.wiring import bind_polling_sources, build_scraper, scrape_settings

__all__ = [
    "KubernetesDiscovery", "PoolSpec", "WatchOptions", "discovery_from_options", "make_api_client", "parse_selector",
    "pod_endpoints",
    "HttpError", "MetricsHttpClient", "ScanState", "LeaderElector", "lease_name_for",
    "BUILTIN_ENGINES", "DEFAULT_ENGINE", "CustomMetric", "EngineConfig", "MetricSpec", "MetricsParseError",
    "MetricsExtractError", "DataLayerErrors",
    "parse_targeted", "parse_with_prometheus_client", "MetricsExtractor", "ScrapeConfig", "ScrapeError", "Scraper",
    "ScrapeStats",
    "StaticFileDiscovery", "EndpointsDocument", "load_endpoints_file", "parse_endpoints", "parse_endpoints_document",
    "build_scraper", "scrape_settings", "bind_polling_sources",
    "MODELS_ATTRIBUTE_KEY", "ModelData", "ModelsParseError", "ModelsResponse", "parse_models", "stored_models",
    "HttpPoller", "PollConfig", "TlsOptionError", "tls_client_context",
]
