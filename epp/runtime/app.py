"""Assemble a running EPP from options: explicit composition at start-up, torn down in reverse.

:class:`EppApp` builds, in order: the plugin registry and pipeline (config), the datastore and its discovery
source (the config's ``dataLayer.discovery`` plugin, else a static file, Kubernetes InferencePool, selector-only
mode, or a fixed list given in code), the metrics
scraper, EPP's own Prometheus metrics, the admission controller (legacy or flow control), the
:class:`~epp.scheduling.director.Director`, and the front ends asked for (ext_proc gRPC, HTTP gateway) plus the metrics
port (``/metrics`` and ``/debug/tenants``) and the kube-scheduler extender's port. ``drain()`` turns readiness off
while the front ends keep serving for the drain window; ``stop()`` drains the front ends' running requests first,
then stops the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from epp.config.loader import Pipeline, build_pipeline, load_config, load_raw
from epp.config.tls import TlsPolicy
from epp.datalayer.datastore import Datastore
from epp.errors import ConfigError
from epp.framework.endpoint import EndpointSpec
from epp.framework.plugins import KVIndexMetrics, PluginService, PrefixIndexMetrics
from epp.framework.pool import EndpointDiscovery, Service
from epp.framework.registry import Registry
from epp.framework.request import DEFAULT_BODY_LIMIT
from epp.headers import HeaderTrust
from epp.metrics.instruments import DEFAULT_MODEL_NAME_LIMIT, LabelCap
from epp.metrics.labels import DEFAULT_LABEL_SET_LIMIT, RequestLabels, ServedModels
from epp.observability import AccessLog, Observer, Tracing, build_tracing, otlp_configured
from epp.runtime.builtins import default_registry
from epp.scheduling.director import Director

if TYPE_CHECKING:
    import ssl

    from epp.extproc.stream_metrics import StreamMetrics
    from epp.metrics.families import EppMetrics
    from epp.metrics.instruments import Family

__all__ = ["ServeOptions", "EppApp", "DEFAULT_BODY_LIMIT", "DEFAULT_DRAIN_TIMEOUT", "EXTPROC_DRAIN_TIMEOUT",
           "instrument_pipeline"]

log = logging.getLogger(__name__)

DEFAULT_DRAIN_TIMEOUT = 30.0
"""The reference's ``--drain-timeout`` default, in seconds (with Kubernetes discovery)."""
EXTPROC_DRAIN_TIMEOUT = 5.0
"""The drain window without Kubernetes discovery when ext_proc is served, in seconds: time for Envoy's active gRPC
health check (``epp envoy-config`` with several ``--epp``) to see NOT_SERVING and send new streams to the other
replicas before this one refuses them (the arithmetic is in docs/extproc.md, "Shutdown")."""


@dataclass
class ServeOptions:
    """Everything ``epp serve`` accepts. Ports set to None are not served; port 0 binds a free port."""

    config: str | None = None
    endpoints_file: str | None = None
    endpoints: list[EndpointSpec] | None = None
    pool_name: str | None = None
    pool_namespace: str = "default"
    endpoint_selector: str | None = None
    target_ports: list[int] = field(default_factory=list)
    kubeconfig: str | None = None
    host: str = "0.0.0.0"
    grpc_port: int | None = 9002
    health_port: int | None = 9003
    metrics_port: int | None = 9090
    http_port: int | None = None
    http_reuse_port: bool = False
    """Gateway: bind with ``SO_REUSEPORT``, so several worker processes share the port (the kernel spreads the
    connections over them)."""
    plaintext: bool = False
    cert_path: str | None = None
    key_path: str | None = None
    extproc_mode: str = "auto"
    extproc_transport: str = "native"
    http_frontend: str = "lean"
    http_keepalive_timeout: float = 75.0
    """Gateway: seconds an idle client connection stays open after its last answer (both front ends; 0 = no limit)."""
    http_client_limits: dict[str, Any] = field(default_factory=dict)
    """Gateway: :class:`~epp.gateway._frontend.ClientLimits` fields set by the ``--http-*`` flags (lean front end)."""
    h2_limits: dict[str, Any] = field(default_factory=dict)
    """ext_proc: :class:`~epp.extproc.h2.connection.H2Limits` fields set by the ``--grpc-*`` connection flags."""
    body_limit: int = DEFAULT_BODY_LIMIT
    use_subset_hint: bool = True
    upstream_timeout: float | None = 300.0
    """Gateway: seconds a model server may take to start its answer, and between two chunks of a stream (None = no
    limit); before the client got a byte it becomes a 504."""
    connect_timeout: float = 5.0
    """Gateway: seconds to connect to a model server (a failed connect is retried on the next endpoint)."""
    retries: int = 1
    """Gateway: further endpoints tried when a connect fails or a 5xx comes before any byte reached the client."""
    refresh_interval: float | None = None
    shutdown_grace: float = 30.0
    """Seconds running requests get to finish when EPP stops (both front ends)."""
    drain_timeout: float | None = None
    """Seconds both front ends keep serving, new requests included, after a stop signal turned readiness
    NOT_SERVING (:meth:`EppApp.drain`); None: the reference's 30 s with Kubernetes discovery, else
    :data:`EXTPROC_DRAIN_TIMEOUT` when ext_proc is served, else 0."""
    grpc_max_recv: int = 0
    """Largest ext_proc message accepted, in bytes; 0: the body limit plus 1 MiB."""
    grpc_max_send: int = 0
    """Largest ext_proc message sent, in bytes; 0: the body limit plus 1 MiB."""
    config_text: str | None = None
    """The EndpointPickerConfig as YAML text (``--config-text``); wins over ``config``."""
    watch_config_file: bool = False
    """Apply changes to ``config``'s scheduling profiles while running (:mod:`epp.config.reload`)."""
    pool_group: str = "inference.networking.k8s.io"
    """The InferencePool's API group: v1 (``inference.networking.k8s.io``) or v1alpha2 (``...x-k8s.io``)."""
    cert_reload: bool = False
    """Reload ``cert_path``/``key_path`` when they change on disk (new TLS handshakes use the new pair)."""
    metrics_auth: bool = False
    """The metrics port wants a Kubernetes bearer token allowed to GET the path (see :mod:`epp.metrics.auth`)."""
    leader_election: bool = False
    """HA mode: only the replica holding the pool's Lease reports ready (see :mod:`epp.datalayer.leader`)."""
    scrape_overrides: dict[str, Any] = field(default_factory=dict)
    """:class:`~epp.datalayer.ScrapeConfig` fields set by the reference's scrape flags."""
    engine_metrics: dict[str, str] = field(default_factory=dict)
    """The default engine's metric specs set by the reference's legacy metric flags ("" = not read)."""
    model_server_metrics_port: int | None = None
    """Scrape this port instead of the endpoint's when the pool has a single target port (legacy flag)."""
    metrics_cert_dir: str | None = None
    """Serve the metrics port over HTTPS with ``tls.crt``/``tls.key`` from this directory (reloaded on change)."""
    metrics_client_ca_file: str | None = None
    """With ``metrics_cert_dir``: metrics clients must present a certificate this PEM CA signed."""
    grpc_stream_metrics: bool = False
    """Export the ext_proc stream metrics (:mod:`epp.extproc.stream_metrics`)."""
    feature_gates: tuple[str, ...] = ()
    """``--feature-gates`` entries, applied after the config's ``featureGates`` (:func:`epp.config.loader.build_pipeline`)."""
    emit_endpoint_scores: bool = False
    """Put the primary profile's per-endpoint scores in ext_proc's ``envoy.lb`` metadata."""
    tls_policy: TlsPolicy = field(default_factory=TlsPolicy)
    """The ext_proc port's minimum TLS version and ciphers (:mod:`epp.config.tls`)."""
    fairness_id_label_limit: int = 1000
    """Distinct ``fairness_id`` label values metrics record before folding new ones into ``other``."""
    xds_port: int | None = None
    """Serve the pool's endpoints to Envoy over xDS (EDS, :mod:`epp.envoy.xds`) on this port; TLS unless ``plaintext``."""
    scheduler_extender_port: int | None = None
    """Serve the kube-scheduler extender (:mod:`epp.extender`: ``/filter``, ``/prioritize``) on this port."""
    trusted_headers: tuple[str, ...] = ()
    """Trusted-only request headers taken from the downstream (:class:`~epp.headers.HeaderTrust`); the others are
    removed from every request on both front ends."""
    model_name_label_limit: int = DEFAULT_MODEL_NAME_LIMIT
    """Distinct model names the pool is not known to serve that the model labels record before folding new ones
    into ``other`` (served ones always keep theirs: :mod:`epp.metrics.labels`)."""
    metric_label_set_limit: int = DEFAULT_LABEL_SET_LIMIT
    """Combinations of model, target model and fairness id a metric family records before folding new ones."""
    tracing: bool | None = None
    """Export OpenTelemetry spans (:mod:`epp.observability.tracing`; needs the ``tracing`` extra); None: when the
    environment names an OTLP endpoint (:func:`~epp.observability.otlp_configured`)."""
    tracing_sampling_ratio: float | None = None
    """The sampler's ratio; None: ``OTEL_TRACES_SAMPLER_ARG``, else the reference's 0.1."""
    span_processor: Any = None
    """With ``tracing``: the SDK ``SpanProcessor`` spans go to (tests, embedders); None: OTLP by the OTEL_* env."""
    access_log: bool = False
    """One JSON line per request on the ``epp.access`` logger (:mod:`epp.observability.access_log`)."""

    @property
    def kubernetes_discovery(self) -> bool:
        """Whether endpoints come from Kubernetes: a pool or selector, and no endpoint list or file (which win)."""
        return self.endpoints is None and self.endpoints_file is None and (
            self.pool_name is not None or self.endpoint_selector is not None)


def instrument_pipeline(pipeline: Pipeline, metrics: EppMetrics) -> None:
    """Wire the request path's plugin metrics: plugin call durations, the prefix indexer's size and hit ratio,
    the precise index's counters and the latency predictor's families (``epp serve`` does this at start-up; the
    gateway benchmark does it to measure the same path)."""
    pipeline.scheduler.timer = metrics.plugin_duration
    for plugin in pipeline.handle.plugins():
        if hasattr(plugin, "use_datalayer_errors"):  # models-data-source counts its failures
            plugin.use_datalayer_errors(metrics)
    producer = next((p for p in pipeline.scheduler.producers if isinstance(p, PrefixIndexMetrics)), None)
    if producer is not None:
        metrics.set_prefix_indexer_size(producer.index_size)
        producer.observer = metrics.observe_prefix_match
    precise = [p for p in pipeline.handle.plugins() if isinstance(p, KVIndexMetrics) and p.enable_metrics]
    if precise:
        from epp.kvcache.metrics import IndexCollector

        metrics.registry.register(IndexCollector(precise))
    latency = [p for p in pipeline.handle.plugins() if hasattr(p, "use_latency_metrics")]
    if latency:  # one set of families for every predicted-latency-producer (they label by plugin name)
        from epp.latency.metrics import LatencyMetrics

        shared = LatencyMetrics(metrics.registry, metrics.labels)
        for plugin in latency:
            plugin.use_latency_metrics(shared)


class _TracingService:
    """The tracer provider as one of the app's services: stopping it exports the spans still pending, off the
    event loop and for :data:`TRACING_FLUSH_TIMEOUT` seconds at most (an unreachable collector cannot hold the
    stop)."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    async def start(self) -> None:
        """The provider is live once built."""

    async def stop(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(self.tracing.shutdown), TRACING_FLUSH_TIMEOUT)


TRACING_FLUSH_TIMEOUT = 5.0


class _PluginRunner:
    """A :class:`~epp.framework.plugins.PluginService` as one of the app's services."""

    def __init__(self, plugin: PluginService, datastore: Datastore) -> None:
        self.plugin, self.datastore = plugin, datastore

    async def start(self) -> None:
        await self.plugin.start(self.datastore)

    async def stop(self) -> None:
        await self.plugin.stop()


class EppApp:
    """A composed EPP. ``await start()`` then serve; ``await stop()`` to drain and shut down."""

    def __init__(self, options: ServeOptions, registry: Registry | None = None) -> None:
        self.options = options
        self.registry = registry or default_registry()
        gates = options.feature_gates
        self.pipeline: Pipeline = (
            load_config(options.config, self.registry, gates) if options.config_text is None
            else build_pipeline(*load_raw(options.config_text, "--config-text"), self.registry, gates))
        self.datastore = Datastore(options.pool_name or "static-pool")
        self.metrics_registry = CollectorRegistry()
        self.fairness_ids = LabelCap(options.fairness_id_label_limit)  # shared by request and flow-control metrics
        models = LabelCap(options.model_name_label_limit, known=ServedModels(self.datastore))
        self.request_labels = RequestLabels(models, self.fairness_ids, options.metric_label_set_limit)  # all labels
        self.director: Director | None = None
        self.extproc: Any = None
        self.gateway: Any = None
        self.xds: Any = None
        self.extender: Any = None
        """The :class:`~epp.extender.ExtenderServer` with ``scheduler_extender_port``, else None."""
        self.admission: Any = None
        self.leader: Any = None
        """The :class:`~epp.datalayer.leader.LeaderElector` with ``leader_election``, else None."""
        self._started: list[Service] = []
        self._draining = False
        self._metrics_runner: web.AppRunner | None = None
        self.metrics_port: int | None = None
        self.stream_metrics: StreamMetrics | None = None
        """The ext_proc :class:`~epp.extproc.stream_metrics.StreamMetrics` with ``grpc_stream_metrics``."""

    async def start(self) -> None:
        """Start every part; on failure, stop what already started and re-raise."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        from epp.metrics.families import EppMetrics, rank_pod_name

        # Kubernetes endpoints are Pods of the pool's namespace; the scheduler-attempts labels name them.
        k8s = self.kubernetes_discovery
        metrics = EppMetrics(self.metrics_registry, namespace=self.options.pool_namespace if k8s else "",
                             pod_name=rank_pod_name if k8s else None, fairness_ids=self.fairness_ids,
                             labels=self.request_labels)
        metrics.attach_pool(self.datastore)
        instrument_pipeline(self.pipeline, metrics)
        self._wire_endpoint_removal()
        await self._start_service(self._discovery())
        if self.options.leader_election:
            self.leader = self._leader_elector()
            await self._start_service(self.leader)
        for plugin in self.pipeline.handle.plugins():
            if self.options.refresh_interval is not None and hasattr(plugin, "use_base_tick"):
                plugin.use_base_tick(self.options.refresh_interval)  # polling sources round to the refresh tick
            if isinstance(plugin, PluginService):
                await self._start_service(_PluginRunner(plugin, self.datastore))
        scraper = self._scraper(metrics)
        if scraper is not None:
            await self._start_service(scraper)
        self.admission = self._admission()
        await self._start_service(self.admission)
        fc = self.pipeline.flow_control
        self.director = Director(self.pipeline, self.datastore, self.admission, metrics,
                                 use_subset_hint=self.options.use_subset_hint,
                                 priorities=fc.priority_for if fc is not None else None,
                                 header_trust=HeaderTrust(self.options.trusted_headers),
                                 observer=await self._observer())
        await self._start_service(self._config_watcher())
        await self._start_metrics_server()
        if self.options.scheduler_extender_port is not None:
            self.extender = self._extender()
            await self._start_service(self.extender)
        if self.options.grpc_port is not None:
            self.extproc = self._extproc()
            await self._start_service(self.extproc)
        if self.options.xds_port is not None:
            self.xds = self._xds()
            await self._start_service(self.xds)
        if self.options.http_port is not None:
            self.gateway = self._gateway()
            await self._start_service(self.gateway)

    async def _observer(self) -> Observer | None:
        """Tracing and the access log as the options ask (None when both are off: no request-path hook runs); the
        tracer provider is flushed at stop."""
        opts = self.options
        on = otlp_configured() if opts.tracing is None else opts.tracing
        tracing = build_tracing(opts.tracing_sampling_ratio, opts.span_processor) if on else None
        if tracing is not None:
            await self._start_service(_TracingService(tracing))
        access_log = AccessLog() if opts.access_log else None
        if tracing is None and access_log is None:
            return None
        return Observer(tracing, access_log)

    @property
    def drain_timeout(self) -> float:
        """The drain window in seconds (:meth:`_drain_window`)."""
        return self._drain_window()[0]

    def _drain_window(self) -> tuple[float, str]:
        """The drain window and where it comes from: ``options.drain_timeout``; else the reference's 30 s with
        Kubernetes discovery (a Service stops sending traffic only once the endpoint controller and the proxies have
        seen readiness fall); else :data:`EXTPROC_DRAIN_TIMEOUT` when ext_proc is served (Envoy's health check
        must see NOT_SERVING before this replica refuses streams); else 0 (nothing routes by its readiness)."""
        if self.options.drain_timeout is not None:
            return self.options.drain_timeout, "--drain-timeout"
        if self.kubernetes_discovery:
            return DEFAULT_DRAIN_TIMEOUT, "the default with Kubernetes discovery"
        if self.options.grpc_port is not None:
            return EXTPROC_DRAIN_TIMEOUT, "the default with ext_proc: Envoy's health check must notice"
        return 0.0, "the default without Kubernetes discovery or ext_proc"

    async def drain(self, interrupt: asyncio.Event | None = None) -> None:
        """The reference's drain window, run before :meth:`stop` on SIGTERM: readiness goes NOT_SERVING (gRPC
        health and the gateway's ``/ready``) and the Lease is released at once, while ext_proc and the gateway keep
        serving, new streams and requests included, so what a proxy sends before it notices is not refused. Returns
        after :attr:`drain_timeout` seconds, or as soon as ``interrupt`` is set (a second signal). Logged."""
        self._mark_draining()
        await self._release_lease()
        window, source = self._drain_window()
        if not any(s is self.extproc or s is self.gateway for s in self._started):
            return
        if window <= 0:
            log.info("no drain window (%s); stopping the front ends now", source)
            return
        log.info("draining for %gs (%s): ext_proc and the gateway keep serving, new requests included, while "
                 "health checks see NOT_SERVING; a second signal ends the window", window, source)
        loop = asyncio.get_running_loop()
        begun = loop.time()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for((interrupt or asyncio.Event()).wait(), window)
        log.info("drain window %s after %.1fs%s; stopping the front ends",
                 "cut short by a second signal" if interrupt and interrupt.is_set() else "elapsed",
                 loop.time() - begun, self._streams_text())

    def _streams_text(self) -> str:
        """``", N ext_proc stream(s) open"`` for the logs when ext_proc serves, else empty."""
        return f", {self.extproc.active_streams} ext_proc stream(s) open" if self.extproc is not None else ""

    async def stop(self) -> None:
        """Stop the front ends first, together: readiness goes NOT_SERVING at once and the ext_proc server and the
        gateway drain side by side, within one ``shutdown_grace`` (one after the other, the gateway's drain delayed
        ext_proc's refusal of new streams and readiness, and the whole stop could take twice the grace). Then
        admission, scraping and discovery. Idempotent."""
        self._mark_draining()
        await self._release_lease()  # hand the Lease over before draining
        fronts = [s for s in self._started if s is self.extproc or s is self.gateway]
        self._started = [s for s in self._started if s not in fronts]
        was_running = bool(fronts or self._started)
        await asyncio.gather(*(self._stop_front(s) for s in fronts))
        while self._started:
            await self._stop_service(self._started.pop())
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
            self._metrics_runner = None
        if was_running:
            log.info("EPP stopped")

    async def _stop_front(self, service: Service) -> None:
        """Stop a front end; the gateway's steps are logged here (ext_proc logs its own)."""
        if service is not self.gateway:
            return await self._stop_service(service)
        loop = asyncio.get_running_loop()
        begun = loop.time()
        log.info("gateway: stopped accepting connections; running requests get up to %gs to finish",
                 self.options.shutdown_grace)
        await self._stop_service(service)
        log.info("gateway stopped after %.2fs", loop.time() - begun)

    async def _release_lease(self) -> None:
        if self.leader is not None and self.leader in self._started:
            self._started.remove(self.leader)
            await self._stop_service(self.leader)

    def _mark_draining(self) -> None:
        """Readiness NOT_SERVING from now on, on the gRPC health service and the gateway's ``/ready`` (logged once)."""
        if self._draining or (self.extproc is None and self.gateway is None):
            return
        self._draining = True
        where = [name for name, on in (("gRPC health", self.extproc is not None and self.extproc.health_port),
                                       ("the gateway's /ready", self.gateway is not None)) if on]
        log.info("readiness is NOT_SERVING from now on (%s)", " and ".join(where) or "no readiness endpoint")
        if self.extproc is not None:
            self.extproc.health.set_draining()
        if self.gateway is not None:
            from epp.gateway import set_draining

            set_draining(self.gateway.app)

    @staticmethod
    async def _stop_service(service: Service) -> None:
        try:
            await service.stop()
        except Exception:  # one part failing to stop must not leave the others running
            log.exception("error while stopping %s", type(service).__name__)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until discovery finished its first sync."""
        await asyncio.wait_for(self.datastore.synced.wait(), timeout)

    async def _start_service(self, service: Service | None) -> None:
        if service is None:
            return
        await service.start()
        self._started.append(service)

    def _config_watcher(self) -> Service | None:
        """With ``watch_config_file``: a watcher of the config file that reloads the scheduling profiles."""
        if not self.options.watch_config_file:
            return None
        from epp.config.reload import ConfigReloader, ConfigWatcher, ReloadMetrics

        path = self.options.config
        if path is None or self.options.config_text is not None or self.pipeline.text is None:
            raise ValueError("--watch-config-file needs --config-file (a --config-text config cannot be reloaded)")
        reloader = ConfigReloader(self.pipeline, self.director, ReloadMetrics(self.metrics_registry), str(path))
        return ConfigWatcher(path, self.pipeline.text.encode("utf-8"), reloader.apply)

    @property
    def kubernetes_discovery(self) -> bool:
        """Whether endpoints come from Kubernetes: the options say so and the config names no discovery plugin."""
        return self.options.kubernetes_discovery and self.pipeline.discovery is None

    def _discovery(self) -> Service | None:
        opts = self.options
        plugin = self.pipeline.discovery
        if plugin is not None:
            given = [flag for flag, value in (("--endpoints", opts.endpoints_file), ("--pool-name", opts.pool_name),
                                              ("--endpoint-selector", opts.endpoint_selector),
                                              ("an endpoint list", opts.endpoints)) if value is not None]
            if given:
                log.warning("dataLayer.discovery names plugin '%s', the endpoint source; %s is ignored", plugin.name,
                            " and ".join(given))
            if not isinstance(plugin, EndpointDiscovery):  # the loader accepts only discovery plugins there
                raise ConfigError(f"dataLayer.discovery: plugin '{plugin.name}' is not an endpoint discovery plugin")
            return plugin.discovery_service(self.datastore)
        if opts.endpoints is not None:
            self.datastore.replace_all(opts.endpoints)
            self.datastore.mark_synced()
            return None
        if opts.endpoints_file is not None:
            from epp.datalayer import StaticFileDiscovery

            return StaticFileDiscovery(opts.endpoints_file, self.datastore)
        if opts.pool_name is not None or opts.endpoint_selector is not None:
            from epp.datalayer.kubernetes import discovery_from_options

            return discovery_from_options(self.datastore, pool_name=opts.pool_name, namespace=opts.pool_namespace,
                                          endpoint_selector=opts.endpoint_selector, target_ports=opts.target_ports,
                                          kubeconfig=opts.kubeconfig, pool_group=opts.pool_group,
                                          metrics_port=opts.model_server_metrics_port)
        raise ValueError("no endpoint source: give --endpoints FILE, --pool NAME or --endpoint-selector, or name a "
                         "discovery plugin in the config's dataLayer.discovery")

    def _leader_elector(self) -> Service:
        """The Lease campaign of HA mode: the reference's Lease name for the pool (selector-only mode: one per
        selector and ports); ConfigError without Kubernetes discovery."""
        from epp.datalayer.leader import LeaderElector, lease_name_for

        opts = self.options
        if not self.kubernetes_discovery:
            raise ConfigError("leader election needs Kubernetes discovery (--pool-name or --endpoint-selector)",
                              field="ha-enable-leader-election")
        name = opts.pool_name or "selector-" + hashlib.sha256(
            f"{opts.endpoint_selector}/{opts.target_ports}".encode()).hexdigest()[:10]
        return LeaderElector(namespace=opts.pool_namespace, name=lease_name_for(opts.pool_namespace, name),
                             kubeconfig=opts.kubeconfig)

    def _scraper(self, metrics: EppMetrics) -> Service | None:
        from epp.datalayer import Scraper, scrape_settings

        settings = scrape_settings(self.pipeline.config, self.pipeline.handle, self.registry)
        if settings is None:
            return None
        config, extractor = settings
        opts = self.options
        if opts.refresh_interval is not None:
            config = dataclasses.replace(config, interval=opts.refresh_interval)
        if opts.scrape_overrides:
            config = dataclasses.replace(config, **opts.scrape_overrides)
        if opts.engine_metrics:
            extractor = extractor.with_default_engine_specs(opts.engine_metrics)
        return Scraper(self.datastore, config, extractor, errors=metrics)

    def _admission(self) -> Service:
        from epp.flowcontrol import build_admission

        return build_admission(self.pipeline.flow_control, self.pipeline.feature_gates,
                               self.pipeline.saturation_detector, self.metrics_registry,
                               handle=self.pipeline.handle, pool_name=self.datastore.pool_name,
                               policies=self.pipeline.flow_policies, pool=self.datastore.endpoints,
                               fairness_ids=self.fairness_ids, labels=self.request_labels)

    def _extproc(self) -> Service:
        from epp.extproc import ExtProcServer
        from epp.extproc.h2.connection import H2Limits
        from epp.extproc.health import HealthService
        from epp.extproc.tls import TlsFiles

        opts = self.options
        tls = TlsFiles(Path(opts.cert_path), Path(opts.key_path)) if opts.cert_path and opts.key_path else None
        assert self.director is not None
        if opts.grpc_stream_metrics:
            from epp.extproc.stream_metrics import StreamMetrics

            self.stream_metrics = StreamMetrics(self.metrics_registry)
        return ExtProcServer(self.director, host=opts.host, port=opts.grpc_port or 0, health_port=opts.health_port,
                             tls=tls, plaintext=opts.plaintext, body_limit=opts.body_limit, mode=opts.extproc_mode,
                             transport=opts.extproc_transport, shutdown_grace=opts.shutdown_grace,
                             cert_reload=opts.cert_reload, health=HealthService(self.datastore, self.leader),
                             stream_metrics=self.stream_metrics, max_recv_message=opts.grpc_max_recv,
                             max_send_message=opts.grpc_max_send, tls_policy=opts.tls_policy,
                             emit_scores=opts.emit_endpoint_scores, h2_limits=H2Limits(**opts.h2_limits))

    def _xds(self) -> Service:
        """The EDS server, with the ext_proc port's certificate (else a self-signed one) unless plaintext."""
        from epp.envoy.xds import XdsServer
        from epp.extproc.tls import self_signed

        opts = self.options
        pair = None if opts.plaintext else getattr(self.extproc, "key_pair", None) or self_signed([opts.host])
        return XdsServer(self.datastore, host=opts.host, port=opts.xds_port or 0, key_pair=pair)

    def _extender(self) -> Service:
        """The scheduler extender over the live pool and the config's saturation detector (the one admission uses),
        answering once discovery has synced."""
        from epp.extender import ExtenderServer, NodePlacer

        return ExtenderServer(NodePlacer(self.pipeline.saturation_detector), self.datastore,
                              self.datastore.synced.is_set, host=self.options.host,
                              port=self.options.scheduler_extender_port or 0)

    def shared_families(self) -> list[Family]:
        """Metric families besides the Director's that ``--workers`` peers report to worker 0."""
        return self.stream_metrics.families() if self.stream_metrics is not None else []

    def _gateway(self) -> Service:
        from epp.gateway import GatewayServer, make_gateway_app
        from epp.gateway._frontend import ClientLimits

        assert self.director is not None
        opts = self.options
        app = make_gateway_app(self.director, body_limit=opts.body_limit, upstream_timeout=opts.upstream_timeout,
                               connect_timeout=opts.connect_timeout, retries=opts.retries, leadership=self.leader)
        return GatewayServer(app, host=self.options.host, port=self.options.http_port or 0,
                             frontend=self.options.http_frontend, shutdown_timeout=self.options.shutdown_grace,
                             reuse_port=self.options.http_reuse_port, keepalive_timeout=opts.http_keepalive_timeout,
                             client_limits=ClientLimits(**opts.http_client_limits))

    async def _start_metrics_server(self) -> None:
        if self.options.metrics_port is None:
            return
        from epp.flowcontrol.debug import DEBUG_TENANTS_PATH, debug_tenants_handler
        from epp.metrics.families import make_metrics_app

        ssl_context = await self._metrics_tls()
        middlewares = []
        if self.options.metrics_auth:
            from epp.metrics.auth import KubeMetricsAuth

            auth = KubeMetricsAuth(kubeconfig=self.options.kubeconfig)
            await self._start_service(auth)
            middlewares.append(auth.middleware())
        app = make_metrics_app(self.metrics_registry, middlewares)
        app.router.add_get(DEBUG_TENANTS_PATH, debug_tenants_handler(self.admission))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.options.host, self.options.metrics_port, ssl_context=ssl_context)
        await site.start()
        self._metrics_runner = runner
        self.metrics_port = next((a[1] for a in runner.addresses if isinstance(a, tuple)), None)

    async def _metrics_tls(self) -> ssl.SSLContext | None:
        """The metrics port's ``ssl.SSLContext`` with ``metrics_cert_dir`` (its file watcher started), else None."""
        if self.options.metrics_cert_dir is None:
            return None
        from epp.metrics.auth import MetricsTls

        tls = MetricsTls(self.options.metrics_cert_dir, self.options.metrics_client_ca_file)
        await self._start_service(tls)
        return tls.context

    def _wire_endpoint_removal(self) -> None:
        forgetters = [p for p in self.pipeline.handle.plugins() if hasattr(p, "remove_endpoint")]
        if not forgetters:
            return

        def on_change(added: list, removed: list) -> None:
            for ep in removed:
                for plugin in forgetters:
                    plugin.remove_endpoint(ep.name)

        self.datastore.subscribe(on_change)
