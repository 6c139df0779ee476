"""``models-data-source``: poll each endpoint's ``/v1/models`` and hand the parsed list to its extractors.

It GETs ``<scheme>://<endpoint>/<path>`` every ``interval`` (rounded to the data layer's tick) and passes the OpenAI
list object to the ``models-data-extractor`` wired to it, which stores it on the endpoint. A failed poll changes
nothing: an endpoint keeps the list of its last good poll. YAML::

    plugins:
    - type: models-data-source
      parameters:
        scheme: http               # or https
        path: /v1/models
        insecureSkipVerify: true   # https: do not verify the server's certificate
        caCertPath: ""             # https: PEM bundle to verify it with instead of the system trust store
        clientCertPath: ""         # https: client certificate for mTLS (with clientKeyPath)
        clientKeyPath: ""
        interval: 5s               # poll period, rounded to the refresh tick; omitted: every tick
    - type: models-data-extractor
    dataLayer:
      sources:
      - pluginRef: models-data-source
        extractors: [{pluginRef: models-data-extractor}]
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from epp.config.units import Duration
from epp.datalayer.models import ModelsResponse, parse_models
from epp.datalayer.polling import HttpPoller, PollConfig, TlsOptionError, tls_client_context
from epp.datalayer.scraper import DataLayerErrors
from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import Handle, PluginService
from epp.framework.plugins import Params as PluginParams
from epp.framework.pool import EndpointPool

__all__ = ["ModelsDataSource", "DEFAULT_BASE_TICK"]

log = logging.getLogger(__name__)

DEFAULT_BASE_TICK = 0.05
"""The data layer's tick when ``--refresh-metrics-interval`` is not given (the reference's default)."""
_POLL_TIMEOUT = 1.0
_MAX_CONCURRENCY = 32


class ModelsDataSource:
    """Polls ``/v1/models`` on every endpoint for the extractors bound to it (see the module docstring).

    Extractors are bound while the config is wired (:func:`epp.datalayer.wiring.bind_polling_sources`); each
    must have ``source_type == "models-data-source"`` and an ``extract(endpoint, response)`` method. Without a
    bound extractor the source does not poll. An extractor that raises is logged and does not affect the others.
    """

    type_name: ClassVar[str] = "models-data-source"

    class Params(PluginParams):
        scheme: Literal["http", "https"] = "http"
        path: str = "/v1/models"
        insecure_skip_verify: bool = Field(True, alias="insecureSkipVerify")
        ca_cert_path: str = Field("", alias="caCertPath")
        client_cert_path: str = Field("", alias="clientCertPath")
        client_key_path: str = Field("", alias="clientKeyPath")
        interval: Duration | None = None

        @field_validator("interval", mode="before")
        @classmethod
        def _empty_is_unset(cls, v: Any) -> Any:
            return None if v == "" else v

        @field_validator("interval")
        @classmethod
        def _positive(cls, v: float | None) -> float | None:
            if v is not None and v <= 0:
                raise ValueError("interval must be positive")
            return v

        @field_validator("path")
        @classmethod
        def _rooted(cls, v: str) -> str:
            return v if v.startswith("/") else "/" + v  # Go's url.URL writes a host-relative path with a slash

    def __init__(self, name: str, params: Params, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params
        self.base_tick = DEFAULT_BASE_TICK
        self._extractors: list[Any] = []
        self._poller: HttpPoller | None = None
        self._errors: DataLayerErrors | None = None
        self._ssl = None
        if params.scheme == "https":
            try:
                self._ssl = tls_client_context(params.insecure_skip_verify, params.ca_cert_path,
                                               params.client_cert_path, params.client_key_path)
            except TlsOptionError as exc:
                raise ConfigError(f"plugin '{name}' (type: {self.type_name}): {exc}", plugin=name,
                                  field=exc.field) from exc

    @property
    def extractors(self) -> tuple[Any, ...]:
        """The extractors bound to this source, in binding order."""
        return tuple(self._extractors)

    @property
    def poller(self) -> HttpPoller | None:
        """The running poller (per-endpoint failures, totals), or None when not started."""
        return self._poller

    def bind_extractor(self, extractor: Any) -> None:
        """Feed ``extractor`` this source's responses; ``ValueError`` when it is not made for this source type.
        Binding the same extractor twice is a no-op."""
        if getattr(extractor, "source_type", None) != self.type_name or not callable(
                getattr(extractor, "extract", None)):
            raise ValueError(f"it takes extractors of {self.type_name} responses (models-data-extractor)")
        if extractor not in self._extractors:
            self._extractors.append(extractor)

    def use_datalayer_errors(self, errors: DataLayerErrors) -> None:
        """Count failed polls and failing extractors into ``errors`` (EPP's metrics) from the next :meth:`start`."""
        self._errors = errors

    def use_base_tick(self, seconds: float) -> None:
        """Set the data layer's tick (``--refresh-metrics-interval``) that ``interval`` is rounded to."""
        if seconds <= 0:
            raise ValueError("the refresh tick must be positive")
        self.base_tick = seconds

    @property
    def interval(self) -> float:
        """Seconds between two polls of an endpoint: ``interval`` rounded to the nearest whole number of ticks
        (at least one), or one tick when it is not set."""
        wanted = self.params.interval
        if wanted is None:
            return self.base_tick
        tick_ns = round(self.base_tick * 1e9)  # Go durations are whole nanoseconds: halves round up exactly
        return max(1, (round(wanted * 1e9) + tick_ns // 2) // tick_ns) * self.base_tick

    async def start(self, pool: EndpointPool) -> None:
        """Start polling ``pool``'s endpoints (nothing to do without a bound extractor). Idempotent."""
        if self._poller is not None:
            return
        if not self._extractors:
            log.info("%s: no models-data-extractor is bound to this source; not polling", self.name)
            return
        p = self.params
        config = PollConfig(scheme=p.scheme, path=p.path, interval=self.interval, timeout=_POLL_TIMEOUT,
                            max_concurrency=_MAX_CONCURRENCY, insecure_skip_verify=p.insecure_skip_verify)
        self._poller = HttpPoller(pool, config, self._deliver, name=self.name, ssl_context=self._ssl,
                                  errors=self._errors, source_type=self.type_name)
        await self._poller.start()

    async def stop(self) -> None:
        """Stop polling. Idempotent."""
        poller, self._poller = self._poller, None
        if poller is not None:
            await poller.stop()

    def _deliver(self, endpoint: Endpoint, body: bytes) -> None:
        response: ModelsResponse = parse_models(body)  # a ModelsParseError fails the poll
        for extractor in self._extractors:
            try:
                extractor.extract(endpoint, response)
            except Exception:  # noqa: BLE001 -- one extractor must not starve the others
                log.exception("%s: extractor %s failed on endpoint %s", self.name, extractor.name, endpoint.name)
                if self._errors is not None:
                    self._errors.datalayer_extract_error(self.type_name, getattr(extractor, "type_name", ""))


_check_service: type[PluginService] = ModelsDataSource
