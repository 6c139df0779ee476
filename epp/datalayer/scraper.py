"""The metrics scraper: one asyncio loop per endpoint, keeping ``Endpoint.metrics`` and health current.

``await scraper.start()`` subscribes to the :class:`~epp.datalayer.datastore.Datastore` and runs a loop for every
endpoint, present and future; a loop stops when its endpoint leaves. Each loop GETs the metrics page through one
shared keep-alive client, parses it with :class:`MetricsExtractor` and replaces ``Endpoint.metrics`` wholesale (a
frozen object: a scheduling cycle reads one consistent snapshot), every ``interval`` ± ``jitter`` with backoff
after failures. Health, written after every attempt: ``healthy = scrape_failures < failure_threshold`` and the
last good metrics are at most ``staleness`` old; an endpoint never scraped is unhealthy. Nothing a model server does
raises out of a loop; failures are logged once per change and counted in :class:`DataLayerErrors` when given.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import aiohttp
from yarl import URL

from epp.datalayer.datastore import Datastore
from epp.datalayer.engines import MetricSpec
from epp.datalayer.http import HttpError, MetricsHttpClient
from epp.datalayer.parsing import (
    BUILTIN_ENGINES,
    DEFAULT_ENGINE,
    EngineConfig,
    MetricsExtractError,
    MetricsParseError,
    ScanState,
    parse_targeted,
)
from epp.framework.endpoint import ENGINE_LABEL, Endpoint, EndpointSpec, Metrics

__all__ = ["ScrapeConfig", "MetricsExtractor", "Scraper", "ScrapeError", "ScrapeStats", "DataLayerErrors",
           "SOURCE_TYPE", "EXTRACTOR_TYPE"]

SOURCE_TYPE = "metrics-data-source"
"""The plugin type of the metrics source the scraper stands for."""
EXTRACTOR_TYPE = "core-metrics-extractor"
"""The plugin type of the extractor that turns its pages into :class:`Metrics`."""

log = logging.getLogger(__name__)

_FLAG_FIELDS = frozenset({"queued", "running", "kv_usage", "lora", "cache_info"})
_ACCEPT = "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"


class DataLayerErrors(Protocol):
    """Where the data layer counts its failures (:class:`epp.metrics.families.EppMetrics` is one): the reference's
    ``datalayer_poll_errors_total{source_type}`` and ``datalayer_extract_errors_total{source_type,
    extractor_type}``, labelled with plugin types. Called from the event loop; must not block or raise."""

    def datalayer_poll_error(self, source_type: str) -> None:
        """A source failed to fetch or read an endpoint's data."""
        ...

    def datalayer_extract_error(self, source_type: str, extractor_type: str) -> None:
        """An extractor failed on data its source read."""
        ...


class ScrapeError(Exception):
    """A scrape failed for a reason other than parsing (HTTP status, page size)."""


@dataclass(frozen=True, slots=True)
class ScrapeConfig:
    """Scrape timing, health thresholds and where metrics live (``scheme``/``path`` as the reference's params).

    ``path`` applies to endpoints whose spec keeps the default ``/metrics``; a spec with another
    ``metrics_path`` (static file ``metricsPath``) wins. The page is fetched from the spec's ``metrics_address``
    (static file ``metricsHost``, else its ``address``) on its ``metrics_port`` (else its ``port``). Likewise
    ``scheme``: an endpoint whose spec says ``https`` (static file ``scheme: https``) is scraped over TLS
    whatever ``scheme`` is. ``compression`` asks servers for gzip: about 12x fewer bytes on the wire for a V1
    page, but inflating costs EPP about as much CPU as parsing (see ``docs/datalayer.md``), so it is off by
    default (``Accept-Encoding: identity``). ``transport`` picks the HTTP
    client: ``lean`` (:mod:`epp.datalayer.http`, the default: ~100 µs less CPU per scrape) or ``aiohttp``.
    """

    interval: float = 0.05
    timeout: float = 1.0
    jitter: float = 0.1
    max_backoff: float = 5.0
    failure_threshold: int = 3
    staleness: float = 2.0
    scheme: str = "http"
    path: str = "/metrics"
    insecure_skip_verify: bool = True
    compression: bool = False
    max_page_bytes: int = 16 * 1024 * 1024
    transport: str = "lean"
    ssl_context: Any = None
    """An ``ssl.SSLContext`` for ``https`` (``metrics-data-source``'s ``caCertPath``/``clientCertPath``); None: the
    system trust store, or no verification with ``insecure_skip_verify``."""

    def __post_init__(self) -> None:
        if self.interval <= 0 or self.timeout <= 0 or self.staleness <= 0:
            raise ValueError("interval, timeout and staleness must be positive")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        if self.scheme not in ("http", "https"):
            raise ValueError(f"scheme must be http or https, not {self.scheme!r}")
        if self.transport not in ("lean", "aiohttp"):
            raise ValueError(f"transport must be lean or aiohttp, not {self.transport!r}")


class MetricsExtractor:
    """Chooses an endpoint's engine and turns its page into :class:`Metrics`.

    The engine is named by the endpoint label ``engine_label_key`` (default ``llm-d.ai/engine-type``), else the
    spec's ``engine`` (static file), else it is ``default_engine``; the Inference Extension's legacy label
    ``inference.networking.k8s.io/engine-type`` is not read, as in the newest reference. A name that is not
    configured falls back to ``default_engine`` with a warning, as the reference's ``MappingRegistry.Get`` does.
    ``engines`` maps names to configs; the built-ins are used unless replaced.
    """

    def __init__(self, engines: Mapping[str, EngineConfig] | None = None, default_engine: str = DEFAULT_ENGINE,
                 engine_label_key: str = ENGINE_LABEL) -> None:
        self.engines = dict(BUILTIN_ENGINES if engines is None else engines)
        if default_engine not in self.engines:
            raise ValueError(f"defaultEngine {default_engine!r} is not a configured engine "
                             f"({', '.join(sorted(self.engines))})")
        self.default_engine = default_engine
        self.engine_label_key = engine_label_key

    def engine_name(self, spec: EndpointSpec) -> str:
        """The engine ``spec`` asks for (labels, then static ``engine``, then the default); maybe unconfigured."""
        labels = spec.labels
        return labels.get(self.engine_label_key) or spec.engine or self.default_engine

    def engine_for(self, spec: EndpointSpec) -> EngineConfig:
        """The engine config for ``spec``: the one it names, or the default engine (logged as a warning on each
        call: the scraper calls this once per endpoint spec) when that name is not configured."""
        name = self.engine_name(spec)
        config = self.engines.get(name)
        if config is None:
            log.warning("endpoint %s: engine %r is not configured (configured: %s); reading its metrics as %r, "
                        "the default engine", spec.name, name, ", ".join(sorted(self.engines)), self.default_engine)
            return self.engines[self.default_engine]
        return config

    def with_default_engine_specs(self, specs: Mapping[str, str]) -> MetricsExtractor:
        """A copy whose default engine reads the given :class:`EngineConfig` fields (``queued``, ``running``,
        ``kv_usage``, ``lora``, ``cache_info``) from these specs instead ("" = not read): the reference's legacy
        metric flags. ``ValueError`` for another field name or a bad spec."""
        engine = self.engines[self.default_engine]
        fields: dict[str, tuple[MetricSpec, ...]] = {}
        for name, text in specs.items():
            if name not in _FLAG_FIELDS:
                raise ValueError(f"engine field {name!r} cannot be set by a metric flag")
            fields[name] = (MetricSpec.parse(text),) if text.strip() else ()
        engines = dict(self.engines)
        engines[self.default_engine] = dataclasses.replace(
            engine, queued=fields.get("queued", engine.queued), running=fields.get("running", engine.running),
            kv_usage=fields.get("kv_usage", engine.kv_usage), lora=fields.get("lora", engine.lora),
            cache_info=fields.get("cache_info", engine.cache_info))
        return MetricsExtractor(engines, self.default_engine, self.engine_label_key)

    def extract(self, text: str, spec: EndpointSpec, now: float | None = None) -> Metrics:
        """Parse ``text`` with ``spec``'s engine; ``MetricsParseError`` on failure."""
        return parse_targeted(text, self.engine_for(spec), now)


class ScrapeStats:
    """Totals since start (benchmarks and diagnostics): successful and failed scrapes."""

    __slots__ = ("ok", "failed")

    def __init__(self) -> None:
        self.ok = 0
        self.failed = 0

    def snapshot(self) -> tuple[int, int]:
        return self.ok, self.failed


class _Loop:
    """Per-endpoint loop state: the task, cached URL/engine for the current spec, last error and timestamps."""

    __slots__ = ("task", "spec", "url", "target", "engine", "scan", "error", "last_ok")

    def __init__(self, last_ok: float) -> None:
        self.task: asyncio.Task[None] | None = None
        self.spec: EndpointSpec | None = None
        self.url: URL | None = None
        self.target: tuple[str, str, int, str] = ("http", "", 0, "/")
        self.scan = ScanState()
        self.engine: EngineConfig | None = None
        self.error: str | None = None
        self.last_ok = last_ok


class Scraper:
    """Scrapes every endpoint of a :class:`Datastore` (see the module docstring for the contract)."""

    def __init__(self, datastore: Datastore, config: ScrapeConfig | None = None,
                 extractor: MetricsExtractor | None = None, *, session: aiohttp.ClientSession | None = None,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 errors: DataLayerErrors | None = None) -> None:
        self.datastore = datastore
        self.config = config or ScrapeConfig()
        self.extractor = extractor or MetricsExtractor()
        self.stats = ScrapeStats()
        self.errors = errors
        self._session = session
        self._owns_session = session is None
        self._http: MetricsHttpClient | None = None
        self._clock = clock
        self._rng = rng or random.Random()
        self._loops: dict[Endpoint, _Loop] = {}
        self._running = False
        self._subscribed = False
        self._timeout = aiohttp.ClientTimeout(total=self.config.timeout)

    @property
    def running(self) -> bool:
        return self._running

    async def start(self) -> None:
        """Start scraping every current endpoint and follow datastore changes. Idempotent."""
        if self._running:
            return
        if self.config.transport == "lean" and self._session is None:
            cfg = self.config
            self._http = MetricsHttpClient(accept=_ACCEPT, compression=cfg.compression,
                                           insecure_skip_verify=cfg.insecure_skip_verify,
                                           max_bytes=cfg.max_page_bytes, ssl_context=cfg.ssl_context)
        elif self._session is None or self._session.closed:
            self._session = self._new_session()
            self._owns_session = True
        self._running = True
        if not self._subscribed:
            self.datastore.subscribe(self._on_change)
            self._subscribed = True
        for ep in self.datastore.endpoints():
            self._start_loop(ep)

    async def stop(self) -> None:
        """Cancel every loop, wait for them, and close the session if this scraper created it."""
        self._running = False
        loops, self._loops = self._loops, {}
        tasks = [lp.task for lp in loops.values() if lp.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    def scraping(self, ep: Endpoint) -> bool:
        """True if a loop is running for ``ep``."""
        lp = self._loops.get(ep)
        return lp is not None and lp.task is not None and not lp.task.done()

    def _new_session(self) -> aiohttp.ClientSession:
        ssl = self.config.ssl_context or (False if self.config.insecure_skip_verify else True)
        connector = aiohttp.TCPConnector(limit=0, ssl=ssl, keepalive_timeout=max(15.0, 4 * self.config.interval))
        headers = {"Accept": _ACCEPT, "Accept-Encoding": "gzip" if self.config.compression else "identity"}
        return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                     timeout=self._timeout, headers=headers)

    def _on_change(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        if not self._running:
            return
        for ep in removed:
            lp = self._loops.pop(ep, None)
            if lp is not None and lp.task is not None:
                lp.task.cancel()
            if self._http is not None:
                self._http.close(ep)
        for ep in added:
            self._start_loop(ep)

    def _start_loop(self, ep: Endpoint) -> None:
        if ep in self._loops:
            return
        # Runs in the datastore's change callback, before any scheduling cycle can see ``ep``. A restarted
        # scraper keeps counting staleness from the endpoint's last good metrics.
        lp = _Loop(ep.metrics.update_time)
        ep.healthy = self._healthy(ep, lp, self._clock())
        self._loops[ep] = lp
        lp.task = asyncio.get_running_loop().create_task(self._run(ep, lp), name=f"scrape:{ep.name}")

    async def _run(self, ep: Endpoint, lp: _Loop) -> None:
        first = True
        while True:
            started = self._clock()
            try:
                await self._scrape_once(ep, lp)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- a model server must never crash EPP
                self._failed(ep, lp, exc)
            else:
                self._succeeded(ep, lp)
            now = self._clock()
            healthy = self._healthy(ep, lp, now)
            if healthy != ep.healthy:
                log.log(logging.INFO if healthy else logging.WARNING, "endpoint %s is now %s (%d consecutive "
                        "scrape failures)", ep.name, "healthy" if healthy else "unhealthy", ep.scrape_failures)
                ep.healthy = healthy
            delay = self._delay(ep.scrape_failures, now - started)
            if first:  # loops added together scrape together once, then spread out
                delay, first = self._rng.uniform(0, delay), False
            await asyncio.sleep(delay)

    async def _scrape_once(self, ep: Endpoint, lp: _Loop) -> None:
        if lp.spec is not ep.spec:
            lp.spec, lp.url = ep.spec, self._url(ep.spec)
            lp.target = (lp.url.scheme, ep.spec.metrics_address or ep.spec.address, lp.url.port or 0,
                         lp.url.raw_path_qs)
            lp.engine, lp.scan = None, ScanState()
            if self._http is not None:
                self._http.close(ep)  # the address may have moved
        if lp.engine is None:
            lp.engine = self.extractor.engine_for(ep.spec)
        if self._http is not None:
            status, body = await self._http.get(ep, *lp.target, self.config.timeout)
            if status != 200:
                raise ScrapeError(f"HTTP {status} from {lp.url}")
        else:
            body = await self._get_aiohttp(lp)
        ep.metrics = parse_targeted(body, lp.engine, self._clock(), lp.scan)

    async def _get_aiohttp(self, lp: _Loop) -> bytes:
        assert self._session is not None and lp.url is not None
        async with self._session.get(lp.url, timeout=self._timeout) as resp:
            if resp.status != 200:
                raise ScrapeError(f"HTTP {resp.status} from {lp.url}")
            limit, length = self.config.max_page_bytes, resp.content_length
            if length is not None and length > limit:
                raise ScrapeError(f"metrics page larger than {limit} bytes")
            if length is not None and resp.headers.get("Content-Encoding", "identity").lower() == "identity":
                return await resp.read()  # the length is the page's: read at once
            return await self._read_limited(resp)

    async def _read_limited(self, resp: aiohttp.ClientResponse) -> bytes:
        # ``resp.content`` is the inflated stream: the limit applies to the page, not to what crossed the wire
        # (a few KB of gzip can inflate to gigabytes). aiohttp >= 3.13.3 inflates in bounded steps as it is read
        # (CVE-2025-69223); older releases inflate each network read whole before this loop sees it.
        limit, chunks, size = self.config.max_page_bytes, [], 0
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise ScrapeError(f"metrics page larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def _url(self, spec: EndpointSpec) -> URL:
        path = spec.metrics_path if spec.metrics_path != "/metrics" else self.config.path
        port = spec.metrics_port or spec.port
        # An endpoint declared https (static file ``scheme``) only speaks TLS: plain http would never reach it.
        scheme = "https" if spec.scheme == "https" else self.config.scheme
        host = spec.metrics_address or spec.address  # static file ``metricsHost`` names another host
        return URL.build(scheme=scheme, host=host, port=port, path=path, encoded=False)

    def _succeeded(self, ep: Endpoint, lp: _Loop) -> None:
        self.stats.ok += 1
        lp.last_ok = ep.metrics.update_time
        ep.scrape_failures = 0
        if lp.error is not None:
            log.info("endpoint %s: metrics scrape recovered (was: %s)", ep.name, lp.error)
            lp.error = None

    def _failed(self, ep: Endpoint, lp: _Loop, exc: BaseException) -> None:
        self.stats.failed += 1
        ep.scrape_failures += 1
        if self.errors is not None:
            if isinstance(exc, MetricsExtractError):
                self.errors.datalayer_extract_error(SOURCE_TYPE, EXTRACTOR_TYPE)
            else:
                self.errors.datalayer_poll_error(SOURCE_TYPE)
        message = _describe(exc)
        if message != lp.error:
            log.warning("endpoint %s: metrics scrape failed: %s", ep.name, message)
            lp.error = message

    def _healthy(self, ep: Endpoint, lp: _Loop, now: float) -> bool:
        if ep.scrape_failures >= self.config.failure_threshold or lp.last_ok <= 0:
            return False
        return now - lp.last_ok <= self.config.staleness

    def _delay(self, failures: int, elapsed: float) -> float:
        cfg = self.config
        spread = self._rng.uniform(1 - cfg.jitter, 1 + cfg.jitter)
        if failures:
            return min(cfg.max_backoff, cfg.interval * 2 ** min(failures, 30)) * spread
        return max(0.0, cfg.interval * spread - elapsed)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    if isinstance(exc, (MetricsParseError, ScrapeError, HttpError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
