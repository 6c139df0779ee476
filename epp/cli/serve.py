"""``epp serve``: run EPP with the ext_proc service and/or the HTTP gateway until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import socket
import sys
import time
from typing import Any

from epp.cli.argtypes import (
    byte_size_arg,
    duration_arg,
    nonnegative_arg,
    port_arg,
    positive_arg,
    positive_duration_arg,
    ranged_arg,
)
from epp.cli.logs import configure_logging
from epp.cli.reference_flags import (
    ReferenceSettings,
    add_reference_flags,
    check_metrics_tls,
    go_bool,
    reference_settings,
)
from epp.config.loader import config_error_text
from epp.errors import ConfigError
from epp.headers import parse_trusted_headers
from epp.metrics.instruments import DEFAULT_MODEL_NAME_LIMIT
from epp.metrics.labels import DEFAULT_LABEL_SET_LIMIT
from epp.runtime.app import DEFAULT_BODY_LIMIT, EppApp, ServeOptions

__all__ = ["add_parser", "run", "options_from_args", "serve_until_signalled", "worker_options"]

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``serve``."""
    p = sub.add_parser("serve", help="run the endpoint picker (ext_proc gRPC and/or OpenAI HTTP gateway)")
    p.add_argument("--config", "--config-file", dest="config",
                   help="EndpointPickerConfig YAML (default: the reference's default profile)")
    p.add_argument("--watch-config-file", type=go_bool, nargs="?", const=True, default=False, metavar="BOOL",
                   help="apply changes to the config file's schedulingProfiles without a restart (needs "
                        "--config-file; other fields need a restart)")
    src = p.add_argument_group("endpoint discovery (one of)")
    src.add_argument("--endpoints", metavar="FILE", help="static endpoints YAML, reloaded when it changes")
    src.add_argument("--pool", "--pool-name", dest="pool", metavar="NAME", help="InferencePool to watch")
    src.add_argument("--endpoint-selector", metavar="K=V,...", help="pod label selector (no InferencePool CRD)")
    p.add_argument("--pool-namespace", default=None,
                   help="namespace of the pool (default: $NAMESPACE, else default)")
    p.add_argument("--endpoint-target-ports", "--target-ports", dest="target_ports", default="", metavar="PORTS",
                   help="comma-separated ports, with --endpoint-selector")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--grpc-port", type=port_arg, default=9002, help="ext_proc port (default 9002); -1 disables it")
    p.add_argument("--health-port", "--grpc-health-port", dest="health_port", type=port_arg, default=9003,
                   help="gRPC health port (default 9003); -1 disables it")
    p.add_argument("--metrics-port", type=port_arg, default=9090, help="Prometheus port (default 9090); -1 disables it")
    p.add_argument("--http-port", type=port_arg, default=None,
                   help="serve the OpenAI-compatible gateway on PORT (default: no gateway)")
    p.add_argument("--xds-port", type=port_arg, default=None,
                   help="serve the pool's endpoints to Envoy over xDS (EDS) on PORT, as `epp envoy-config` (--lb "
                        "override-host) expects, on 18000 unless told (default: no xDS)")
    p.add_argument("--scheduler-extender-port", type=port_arg, default=None, metavar="PORT",
                   help="serve the kube-scheduler extender (POST /filter and /prioritize, placing pods by the "
                        "pool's live headroom: docs/extender.md) on PORT, e.g. 9010 (default: off)")
    p.add_argument("--plaintext", action="store_true", help="ext_proc without TLS")
    p.add_argument("--cert-path", help="TLS certificate file, or a directory holding tls.crt and tls.key (the "
                                       "reference's form); default: self-signed, generated at start")
    p.add_argument("--key-path", help="TLS key file, with a --cert-path file")
    p.add_argument("--mode", default="auto", choices=["auto", "full-duplex", "buffered"],
                   help="ext_proc request body mode (auto: learn it from Envoy's protocol_config)")
    p.add_argument("--extproc-transport", default="native", choices=["native", "grpcio"],
                   help="what serves the ext_proc gRPC method: EPP's own HTTP/2 transport (native, a quarter to a "
                        "third of grpc.aio's CPU per request) or grpc.aio")
    p.add_argument("--http-frontend", default="lean", choices=["lean", "aiohttp"],
                   help="what serves the HTTP gateway: EPP's own HTTP/1.1 server (lean, 0.07–0.2 ms less CPU per "
                        "request in bench.http_gateway) or aiohttp's")
    p.add_argument("--body-limit", type=positive_arg, default=DEFAULT_BODY_LIMIT, help="bytes; larger bodies get 413")
    gw = p.add_argument_group("HTTP gateway upstream requests")
    gw.add_argument("--upstream-timeout", type=duration_arg, default=300.0, metavar="DURATION",
                    help="how long a model server may take to start its answer, and between two chunks of a "
                         "stream (default 5m); before the client got a byte it gets 504; 0 = no limit")
    gw.add_argument("--connect-timeout", type=positive_duration_arg, default=5.0, metavar="DURATION",
                    help="how long connecting to a model server may take (default 5s)")
    gw.add_argument("--retries", type=_retries_arg, default=1, metavar="N",
                    help="further endpoints tried after a failed connect or a 5xx before any byte reached the "
                         "client (default 1; 0 = none)")
    _add_client_limit_flags(p)
    p.add_argument("--disable-endpoint-subset-filter", action="store_true", help="ignore the subset hint")
    p.add_argument("--trusted-headers", type=_trusted_headers_arg, default=(), metavar="NAME[,NAME...]",
                   help="trusted-only request headers to take from the downstream (a gateway that sets or strips "
                        "them), e.g. x-llm-d-router-model-name-rewrite; unnamed ones are removed from every "
                        "request on both front ends (docs/extproc.md#header-trust)")
    p.add_argument("--refresh-metrics-interval", type=positive_duration_arg, default=None, metavar="DURATION",
                   help="time between scrapes of an endpoint, e.g. 50ms (the default), 1s, or seconds")
    p.add_argument("--workers", type=positive_arg, default=1,
                   help="run N EPP processes on ext_proc ports from --grpc-port up, skipping EPP's health, "
                        "metrics, gateway, xDS and extender ports (printed at start; list them all in Envoy: epp "
                        "envoy-config --epp host:p1,host:p2,...); they share in-flight, prefix and metrics state. "
                        "All serve the HTTP gateway on the one --http-port (worker 0 alone in HA mode); worker 0 "
                        "serves health, metrics (which count every worker's requests) and the scheduler extender")
    p.add_argument("--shutdown-grace", type=duration_arg, default=30.0, metavar="DURATION",
                   help="on SIGTERM, how long running requests may take to finish, e.g. 30s (the default, "
                        "Kubernetes' default termination grace period), 1m30s, or seconds")
    p.add_argument("--model-name-metric-label-limit", type=_label_limit_arg, default=DEFAULT_MODEL_NAME_LIMIT,
                   metavar="N", help="distinct model names the pool is not known to serve that metric labels "
                   "record before folding new ones into 'other' (default 100; served models always keep their own)")
    p.add_argument("--metric-label-set-limit", type=_label_limit_arg, default=DEFAULT_LABEL_SET_LIMIT, metavar="N",
                   help="combinations of model, target model and fairness id a metric family records before new "
                        "ones fold fairness id and unserved models into 'other' (default 2000)")
    p.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING or ERROR (default INFO; wins over "
                                                      "--v and --zap-log-level)")
    p.add_argument("--access-log", type=go_bool, nargs="?", const=True, default=False, metavar="BOOL",
                   help="one JSON line per request on the epp.access logger at INFO, and one per request EPP "
                        "refuses (rate-limited); default false")
    p.add_argument("--tracing-sampling-ratio", type=_ratio_arg, default=None, metavar="RATIO",
                   help="share of new traces sampled, 0 to 1 (parentbased_traceidratio: a client's sampled flag "
                        "wins); default OTEL_TRACES_SAMPLER_ARG, else 0.1")
    add_reference_flags(p)
    p.set_defaults(func=run)


_ratio_arg = ranged_arg(float, 0.0, 1.0, "ratio")
_retries_arg = ranged_arg(int, 0, 10, "retry count")


def _label_limit_arg(text: str) -> int:
    """An argparse type for a metric label limit: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {value}")
    return value


def _add_client_limit_flags(p: argparse.ArgumentParser) -> None:
    """The gateway's deadlines and caps on its clients (``--http-*``; :class:`epp.gateway._frontend.ClientLimits`,
    whose defaults the help repeats; a flag not given leaves its default)."""
    cl = p.add_argument_group("HTTP gateway client connections (the lean front end; --http-keepalive-timeout both)")
    cl.add_argument("--http-keepalive-timeout", type=duration_arg, default=75.0, metavar="DURATION",
                    help="close a client connection idle this long after its last answer (default 75s, nginx's "
                         "keepalive_timeout); 0 = no limit")
    cl.add_argument("--http-header-timeout", type=duration_arg, default=None, metavar="DURATION",
                    help="close a client connection whose request head is not complete this long after its first "
                         "byte (default 30s); 0 = no limit")
    cl.add_argument("--http-body-timeout", type=duration_arg, default=None, metavar="DURATION",
                    help="close a client connection whose request body pauses this long, or brings less than "
                         "--http-body-min-rate in such a period (default 60s, nginx's client_body_timeout); "
                         "0 = no limit")
    cl.add_argument("--http-body-min-rate", type=nonnegative_arg, default=None, metavar="BYTES",
                    help="bytes a second a request body must average over each --http-body-timeout period "
                         "(default 1024); 0 = any progress")
    cl.add_argument("--http-max-connections", type=nonnegative_arg, default=None, metavar="N",
                    help="open client connections at most; beyond it a new one is answered 503 and closed "
                         "(default: half the open-file limit less 64; 0 = no limit)")
    cl.add_argument("--http-max-head-size", type=byte_size_arg, default=None, metavar="BYTES",
                    help="largest request head (target and header fields), and trailer section (default 128KiB; "
                         "larger ones get 400)")
    cl.add_argument("--http-pipeline-buffer", type=byte_size_arg, default=None, metavar="BYTES",
                    help="bytes of pipelined requests read from a connection while it is being answered before "
                         "reading pauses (default 1MiB)")
    cl.add_argument("--http-held-budget", type=byte_size_arg, default=None, metavar="BYTES",
                    help="bytes of requests not yet served (unfinished bodies, pipelined requests) held over all "
                         "connections; a connection with an unfinished request past it gets 503 (default 256MiB)")
    h2 = p.add_argument_group("ext_proc HTTP/2 connections (the native transport)")
    h2.add_argument("--grpc-preface-timeout", type=duration_arg, default=None, metavar="DURATION",
                    help="close a connection that has not sent the HTTP/2 preface and SETTINGS this long after "
                         "accept (default 10s)")
    h2.add_argument("--grpc-idle-timeout", type=duration_arg, default=None, metavar="DURATION",
                    help="close a connection gracefully (GOAWAY) after this long without open streams (default "
                         "300s, below Envoy's 1h connection idle timeout); 0 = never")
    h2.add_argument("--grpc-max-concurrent-streams", type=positive_arg, default=None, metavar="N",
                    help="streams one connection may hold open (SETTINGS_MAX_CONCURRENT_STREAMS, default 1000); "
                         "more are refused (REFUSED_STREAM)")


_H2_LIMIT_FLAGS = {"grpc_preface_timeout": "preface_timeout", "grpc_idle_timeout": "idle_timeout",
                   "grpc_max_concurrent_streams": "max_concurrent_streams"}
_CLIENT_LIMIT_FLAGS = {"http_header_timeout": "header_timeout", "http_body_timeout": "body_timeout",
                       "http_body_min_rate": "body_min_rate", "http_max_connections": "max_connections",
                       "http_max_head_size": "max_head", "http_pipeline_buffer": "pipeline_buffer",
                       "http_held_budget": "held_budget"}


def _given(args: argparse.Namespace, flags: dict[str, str]) -> dict[str, Any]:
    """The limit fields that ``flags`` (argparse dest -> field name) set on the command line (those given), so the
    limits' own dataclass keeps the defaults: ``ClientLimits`` for ``--http-*``, ``H2Limits`` for ``--grpc-*``."""
    return {field: getattr(args, flag) for flag, field in flags.items() if getattr(args, flag, None) is not None}


def _trusted_headers_arg(text: str) -> tuple[str, ...]:
    try:
        return parse_trusted_headers(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def options_from_args(args: argparse.Namespace, settings: ReferenceSettings | None = None) -> ServeOptions:
    """Translate parsed arguments into :class:`ServeOptions` (-1 ports mean "off"); ``settings`` are the reference
    flags' (computed here if not given; ``ValueError`` naming a flag whose value cannot be used)."""
    def port(value: int | None) -> int | None:
        return None if value is None or value < 0 else value

    ref = settings or reference_settings(args, args.log_level is not None)
    if args.watch_config_file and (args.config is None or ref.config_text is not None):
        raise ValueError("--watch-config-file needs --config-file (a --config-text config cannot be reloaded)")
    cert, key = ref.cert_files or (None, None)
    options = ServeOptions(
        config=args.config, endpoints_file=args.endpoints, pool_name=args.pool, pool_namespace=ref.pool_namespace,
        endpoint_selector=args.endpoint_selector,
        target_ports=[int(x) for x in args.target_ports.split(",") if x.strip()], kubeconfig=args.kubeconfig,
        host=args.host, grpc_port=port(args.grpc_port), health_port=port(args.health_port),
        metrics_port=port(args.metrics_port), http_port=port(args.http_port), xds_port=port(args.xds_port),
        scheduler_extender_port=port(args.scheduler_extender_port),
        plaintext=args.plaintext or bool(ref.plaintext), cert_path=cert, key_path=key,
        extproc_mode=args.mode, extproc_transport=args.extproc_transport, http_frontend=args.http_frontend,
        body_limit=args.body_limit, use_subset_hint=not args.disable_endpoint_subset_filter,
        refresh_interval=args.refresh_metrics_interval, shutdown_grace=args.shutdown_grace,
        upstream_timeout=args.upstream_timeout or None, connect_timeout=args.connect_timeout, retries=args.retries,
        config_text=ref.config_text, watch_config_file=args.watch_config_file, pool_group=ref.pool_group,
        cert_reload=ref.cert_reload,
        leader_election=ref.leader_election, scrape_overrides=dict(ref.scrape),
        engine_metrics=dict(ref.engine_metrics), model_server_metrics_port=ref.metrics_port,
        drain_timeout=ref.drain_timeout, grpc_max_recv=ref.grpc_max_recv, grpc_max_send=ref.grpc_max_send,
        feature_gates=ref.feature_gates, emit_endpoint_scores=ref.emit_scores, tls_policy=ref.tls_policy,
        fairness_id_label_limit=ref.fairness_id_limit)
    options.model_name_label_limit = args.model_name_metric_label_limit
    options.metric_label_set_limit = args.metric_label_set_limit
    options.trusted_headers = args.trusted_headers
    options.http_keepalive_timeout = args.http_keepalive_timeout
    options.http_client_limits = _given(args, _CLIENT_LIMIT_FLAGS)
    options.h2_limits = _given(args, _H2_LIMIT_FLAGS)
    options.tracing = ref.tracing
    options.tracing_sampling_ratio = args.tracing_sampling_ratio
    options.access_log = args.access_log
    # The reference's default, on: there is an API server to check tokens with only under Kubernetes discovery.
    options.metrics_auth = options.kubernetes_discovery if ref.metrics_auth is None else ref.metrics_auth
    _metrics_tls_options(options, ref)
    return options


def _metrics_tls_options(options: ServeOptions, ref: ReferenceSettings) -> None:
    """Metrics TLS and the ext_proc stream metrics, checked as the reference checks them (``ValueError``)."""
    check_metrics_tls(ref.metrics_cert_dir, ref.metrics_client_ca_file, options.metrics_auth,
                      auth_given=ref.metrics_auth is not None)
    options.metrics_cert_dir, options.metrics_client_ca_file = ref.metrics_cert_dir, ref.metrics_client_ca_file
    options.grpc_stream_metrics = ref.stream_metrics


async def serve_until_signalled(app: EppApp, banner: bool = True, link: Any = None,
                                ignore_late_signals: bool = False) -> None:
    """Start ``app`` (and its worker ``link``), print where it listens, and on SIGINT or SIGTERM drain
    (:meth:`EppApp.drain`: readiness off, still serving for the drain window, which a second signal ends) and
    stop cleanly. Each step is logged. ``ignore_late_signals`` (a process's main, never a test's): once stopped,
    further signals are ignored while the process exits (:func:`_ignore_late_signals`)."""
    # A worker gets a signal sent to its process group (Ctrl-C, timeout(1), systemd's control-group kill) twice:
    # directly and forwarded by the parent; the copy must not end the drain window.
    signals = _ShutdownSignals(repeat_grace=_FORWARDED_COPY_S if link is not None else 0.0)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals.received, sig)
    await app.start()
    try:
        if link is not None:
            assert app.director is not None
            link.attach(app.director, app.shared_families())
            await link.start()
        if banner:
            _print_banner(app)
        await signals.stop.wait()
        await app.drain(signals.interrupt)
    finally:
        if link is not None:
            await link.stop()
        await app.stop()
        if ignore_late_signals:
            _ignore_late_signals(loop)


def _ignore_late_signals(loop: asyncio.AbstractEventLoop) -> None:
    """After a clean stop, a supervisor that repeats SIGTERM (or an extra Ctrl-C) would otherwise meet the default
    action while the interpreter tears down (which can take a second: grpc's threads), and a process that stopped
    cleanly would die by the signal: ignore them from now on. ``SIG_IGN``, not a Python handler: the interpreter
    resets Python handlers to the default action when it finalizes; SIGKILL still ends a hung exit."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)  # else closing the loop would restore the default action
        signal.signal(sig, signal.SIG_IGN)


_FORWARDED_COPY_S = 1.0
"""In a worker, a repeat of the first signal this soon is the parent's forwarded copy, not a second signal."""


class _ShutdownSignals:
    """The first signal sets :attr:`stop` (start the shutdown); a later one sets :attr:`interrupt` (end the drain
    window), unless it is the first signal again within ``repeat_grace`` seconds."""

    def __init__(self, repeat_grace: float = 0.0) -> None:
        self.stop, self.interrupt = asyncio.Event(), asyncio.Event()
        self.repeat_grace = repeat_grace
        self._first: tuple[signal.Signals, float] | None = None

    def received(self, sig: signal.Signals) -> None:
        now = time.monotonic()
        if self._first is None:
            self._first = (sig, now)
            log.info("%s received: shutting down", sig.name)
            self.stop.set()
        elif sig == self._first[0] and now - self._first[1] < self.repeat_grace:
            log.debug("%s again within %gs: the forwarded copy of the first, ignored", sig.name, self.repeat_grace)
        else:
            log.info("%s again: ending the drain window", sig.name)
            self.interrupt.set()


def worker_grpc_ports(options: ServeOptions, size: int) -> list[int | None]:
    """The ext_proc ports of ``size`` workers: from ``--grpc-port`` upwards, skipping the health, metrics, gateway,
    xDS and scheduler extender ports worker 0 also listens on (with the defaults: 9002, 9004, 9005, ...; 9003 is
    health). Port 0 or None (any free port, or no ext_proc) is the same for every worker."""
    base = options.grpc_port
    if not base:
        return [base] * size
    taken = {options.health_port, options.metrics_port, options.http_port, options.xds_port,
             options.scheduler_extender_port}
    ports: list[int | None] = []
    port = base
    while len(ports) < size:
        if port not in taken:
            ports.append(port)
        port += 1
    return ports


def worker_options(options: ServeOptions, index: int, size: int = 2) -> ServeOptions:
    """Worker ``index``'s options (of ``size``): its port of :func:`worker_grpc_ports`. Every worker serves the
    gateway on the one ``--http-port`` (``SO_REUSEPORT``), except in HA mode, where only worker 0 does (it alone
    campaigns for the Lease, so only its ``/ready`` can tell); only worker 0 serves health, metrics, xDS and the
    scheduler extender."""
    shared = size > 1 and options.http_port is not None and not options.leader_election
    if index == 0:
        return dataclasses.replace(options, http_reuse_port=shared) if shared else options
    port = worker_grpc_ports(options, index + 1)[index]
    return dataclasses.replace(options, grpc_port=port, health_port=None, metrics_port=None, xds_port=None,
                               scheduler_extender_port=None,
                               http_port=options.http_port if shared else None, http_reuse_port=shared,
                               leader_election=False, metrics_auth=False)


def fixed_http_port(options: ServeOptions, host: str) -> ServeOptions:
    """``--http-port 0`` with several workers: one free port chosen now, for all of them to share."""
    if options.http_port != 0:
        return options
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return dataclasses.replace(options, http_port=sock.getsockname()[1])


def _worker_main(index: int, size: int, directory: str, options: ServeOptions, logs: ReferenceSettings) -> None:
    """One worker process of ``epp serve --workers N`` (module level: it is pickled by ``spawn``)."""
    from epp.config.loader import DataLayerSpec
    from epp.gateway import run as run_loop
    from epp.runtime.workers import PeerLink, die_with_parent

    die_with_parent()
    configure_logging(logs.log_level, json=logs.log_json, time_encoding=logs.log_time, worker=index)
    try:
        app = EppApp(worker_options(options, index, size))
        if index != 0:
            app.pipeline.config.data_layer = DataLayerSpec(sources=[])  # worker 0 scrapes for everyone
        run_loop(serve_until_signalled(app, banner=True, link=PeerLink(index, size, directory),
                                       ignore_late_signals=True))
    except (ConfigError, ValueError, OSError, RuntimeError) as exc:
        print(f"error: worker {index}: {_error_text(exc)}", file=sys.stderr, flush=True)
        sys.exit(2)


def _error_text(exc: Exception) -> str:
    return config_error_text(exc) if isinstance(exc, ConfigError) else str(exc)


def _print_banner(app: EppApp) -> None:
    parts = []
    if app.extproc is not None:
        parts.append(f"ext_proc :{app.extproc.port} ({'plaintext' if app.options.plaintext else 'TLS'}), "
                     f"health :{app.extproc.health_port}")
    if app.gateway is not None:
        parts.append(f"gateway {app.gateway.url}")
    if app.xds is not None:
        parts.append(f"xds :{app.xds.port}")
    if app.extender is not None:
        parts.append(f"scheduler extender :{app.extender.port}")
    if app.metrics_port is not None:
        tls = " (HTTPS)" if app.options.metrics_cert_dir else ""
        parts.append(f"metrics :{app.metrics_port}/metrics{tls}")
    print("epp serving: " + "; ".join(parts), flush=True)


def run(args: argparse.Namespace) -> int:
    """Run until signalled; exit 2 on a configuration error or a flag value that cannot be used."""
    try:
        settings = reference_settings(args, args.log_level is not None)
        options = options_from_args(args, settings)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, json=settings.log_json, time_encoding=settings.log_time)
    for warning in settings.warnings:
        log.warning(warning)
    try:
        app = EppApp(options)
    except ConfigError as exc:
        print(f"error: {config_error_text(exc)}", file=sys.stderr)
        return 2
    if args.workers > 1:
        from epp.runtime.workers import run_workers

        options = fixed_http_port(options, options.host)
        ports = worker_grpc_ports(options, args.workers)
        if options.grpc_port:
            print(f"epp workers' ext_proc ports: {', '.join(map(str, ports))} (list them all in Envoy: epp "
                  f"envoy-config --epp {','.join(f'HOST:{p}' for p in ports)})", flush=True)
        return run_workers(args.workers, _worker_main, options, settings)
    from epp.gateway import run as run_loop

    try:
        run_loop(serve_until_signalled(app, ignore_late_signals=True))
    except (ConfigError, ValueError, OSError, RuntimeError) as exc:  # e.g. a bad endpoints file, a busy port
        print(f"error: {_error_text(exc)}", file=sys.stderr)
        return 2
    return 0
