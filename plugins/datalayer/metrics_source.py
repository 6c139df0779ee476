"""``metrics-data-source``: scrape each endpoint's Prometheus page.

Parameters are the reference's (``scheme``, ``path``, ``insecureSkipVerify``, ``caCertPath``, ``clientCertPath``,
``clientKeyPath``) plus EPP's scrape knobs. The TLS files are read once at start-up. The plugin only carries
configuration; :func:`epp.datalayer.build_scraper` turns it into a running :class:`~epp.datalayer.Scraper`.

YAML::

    plugins:
    - type: metrics-data-source
      parameters:
        scheme: http               # or https
        path: /metrics
        insecureSkipVerify: true
        caCertPath: /etc/certs/ca.crt      # optional, each
        clientCertPath: /etc/certs/tls.crt
        clientKeyPath: /etc/certs/tls.key
        refreshInterval: 50ms      # scrape period per endpoint
        timeout: 1s                # per scrape
        jitter: 0.1                # ± fraction of the period
        maxBackoff: 5s             # longest delay after consecutive failures
        failureThreshold: 3        # consecutive failures that mark an endpoint unhealthy
        stalenessThreshold: 2s     # metrics older than this mark an endpoint unhealthy
        compression: false         # ask for gzip: ~12x fewer bytes, ~+60 µs CPU per scrape
        transport: lean            # HTTP client: lean (EPP's keep-alive GET client) or aiohttp
    dataLayer:
      sources:
      - pluginRef: metrics-data-source
        extractors: [{pluginRef: core-metrics-extractor}]
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from epp.config.units import Duration
from epp.datalayer.polling import TlsOptionError, tls_client_context
from epp.datalayer.scraper import ScrapeConfig
from epp.errors import ConfigError
from epp.framework.plugins import Handle
from epp.framework.plugins import Params as PluginParams

__all__ = ["MetricsDataSource"]


class MetricsDataSource:
    """Configuration of the metrics scraper (see the module docstring for the YAML)."""

    type_name: ClassVar[str] = "metrics-data-source"

    class Params(PluginParams):
        scheme: Literal["http", "https"] = "http"
        path: str = Field("/metrics", pattern="^/")
        insecure_skip_verify: bool = Field(True, alias="insecureSkipVerify")
        ca_cert_path: str = Field("", alias="caCertPath")
        client_cert_path: str = Field("", alias="clientCertPath")
        client_key_path: str = Field("", alias="clientKeyPath")
        refresh_interval: Duration = Field(0.05, alias="refreshInterval", gt=0)
        timeout: Duration = Field(1.0, gt=0)
        jitter: float = Field(0.1, ge=0, lt=1)
        max_backoff: Duration = Field(5.0, alias="maxBackoff", gt=0)
        failure_threshold: int = Field(3, alias="failureThreshold", ge=1)
        staleness_threshold: Duration = Field(2.0, alias="stalenessThreshold", gt=0)
        compression: bool = False
        transport: Literal["lean", "aiohttp"] = "lean"

    def __init__(self, name: str, params: Params, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params
        self._ssl = None
        if params.ca_cert_path or params.client_cert_path or params.client_key_path:
            try:  # only when a file is named: the default context stays the scraper's own
                self._ssl = tls_client_context(params.insecure_skip_verify, params.ca_cert_path,
                                               params.client_cert_path, params.client_key_path)
            except TlsOptionError as exc:
                raise ConfigError(f"plugin '{name}' (type: {self.type_name}): {exc}", plugin=name,
                                  field=exc.field) from exc

    def scrape_config(self) -> ScrapeConfig:
        """The :class:`ScrapeConfig` these parameters describe."""
        p = self.params
        return ScrapeConfig(interval=p.refresh_interval, timeout=p.timeout, jitter=p.jitter,
                            max_backoff=p.max_backoff, failure_threshold=p.failure_threshold,
                            staleness=p.staleness_threshold, scheme=p.scheme, path=p.path,
                            insecure_skip_verify=p.insecure_skip_verify, compression=p.compression,
                            transport=p.transport, ssl_context=self._ssl)
