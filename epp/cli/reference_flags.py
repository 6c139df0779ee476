"""The reference EPP's command-line flags on ``epp serve``, so that its Deployment's ``args`` run EPP unchanged.

This module declares them and turns their values into :class:`ReferenceSettings`; ``epp serve`` applies those to
:class:`~epp.runtime.app.ServeOptions` and logging. Boolean flags follow Go (``--flag`` alone is true,
``--flag=VALUE`` takes ``strconv.ParseBool`` spellings; anything else is a usage error naming the flag). Flags whose
effect EPP has change what EPP does; flags for Go-only machinery are accepted and have no effect. None in
:class:`ReferenceSettings` means "not given", so EPP's own defaults apply. The flag-by-flag catalogue is in
docs/reference-parity.md.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from epp.cli.logs import TIME_ENCODINGS
from epp.config.tls import TlsPolicy
from epp.datalayer.engines import MetricSpec
from epp.headers import SCORES_KEY
from epp.metrics.instruments import DEFAULT_FAIRNESS_ID_LIMIT

__all__ = ["go_bool", "add_reference_flags", "ReferenceSettings", "reference_settings", "check_metrics_tls",
           "POOL_GROUPS", "METRIC_FLAGS"]

log = logging.getLogger(__name__)

POOL_GROUPS = ("inference.networking.k8s.io", "inference.networking.x-k8s.io")
"""InferencePool API groups ``--pool-group`` accepts: v1 and the older v1alpha2."""

METRIC_FLAGS = {"total_queued_requests_metric": "queued", "total_running_requests_metric": "running",
                "kv_cache_usage_percentage_metric": "kv_usage", "lora_info_metric": "lora",
                "cache_info_metric": "cache_info"}
"""Legacy metric flag (argparse dest) -> the :class:`~epp.datalayer.engines.EngineConfig` field it replaces."""

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_ZAP_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR,
               "dpanic": logging.CRITICAL, "panic": logging.CRITICAL, "fatal": logging.CRITICAL}


def go_bool(text: str) -> bool:
    """An argparse type for a Go boolean flag's value (``strconv.ParseBool``)."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value {text!r} (true or false)")


def _bool_flag(group: argparse._ArgumentGroup, name: str, default: bool, help_text: str) -> None:
    group.add_argument(name, type=go_bool, nargs="?", const=True, default=None, metavar="BOOL",
                       help=f"{help_text} (reference default {str(default).lower()})")


def _metric_spec(text: str) -> str:
    """An argparse type for a metric-name flag: ``name`` or ``name{k=v,...}``, outer double quotes dropped."""
    text = _unquote(text)
    if text:
        try:
            MetricSpec.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1].strip()
    return text


def add_reference_flags(p: argparse.ArgumentParser) -> None:
    """Declare the reference's flags that ``epp serve`` does not already have under the same name."""
    from epp.cli.argtypes import duration_arg, positive_duration_arg

    g = p.add_argument_group("reference EPP flags (its Deployment args run unchanged; see docs/kubernetes.md)")
    g.add_argument("--config-text", metavar="YAML", help="the EndpointPickerConfig as text, instead of a file")
    g.add_argument("--pool-group", type=_unquote, default=POOL_GROUPS[0], choices=POOL_GROUPS,
                   help="API group of the InferencePool: inference.networking.k8s.io (v1, the default) or "
                        "inference.networking.x-k8s.io (v1alpha2)")
    _bool_flag(g, "--secure-serving", True, "serve ext_proc over TLS; false is --plaintext")
    _bool_flag(g, "--enable-cert-reload", False, "reload --cert-path's certificate and key when the files change")
    _bool_flag(g, "--ha-enable-leader-election", False,
               "run as one of several replicas: only the replica holding the pool's Lease reports ready")
    g.add_argument("--v", type=int, default=None, metavar="N",
                   help="log verbosity: 4 or more logs at debug level (reference default 2)")
    g.add_argument("--zap-encoder", choices=["json", "console"], default=None, help="log format")
    g.add_argument("--zap-log-level", default=None, metavar="LEVEL",
                   help="debug, info, error, ... or a verbosity number")
    _bool_flag(g, "--zap-devel", False, "development logging (console encoder, debug level)")
    g.add_argument("--zap-stacktrace-level", default=None, metavar="LEVEL", help="accepted; no effect")
    g.add_argument("--zap-time-encoding", default=None, choices=TIME_ENCODINGS, help="time format of json logs")
    _bool_flag(g, "--tracing", True,
               "export OpenTelemetry spans over OTLP (OTEL_* environment; needs the 'tracing' extra); not given: "
               "on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set")
    _bool_flag(g, "--metrics-endpoint-auth", True,
               "the metrics port wants a bearer token the Kubernetes API authenticates (TokenReview) and allows "
               "GET on the path (SubjectAccessReview); default: true with Kubernetes discovery, else false")
    g.add_argument("--metrics-cert-dir", type=_unquote, default=None, metavar="DIR",
                   help="serve the metrics port over HTTPS with DIR/tls.crt and DIR/tls.key (reloaded when they "
                        "change); needs --metrics-client-ca-file or --metrics-endpoint-auth")
    g.add_argument("--metrics-client-ca-file", type=_unquote, default=None, metavar="FILE",
                   help="PEM CA for metrics mTLS: require client certificates it signed (needs --metrics-cert-dir)")
    _bool_flag(g, "--enable-grpc-stream-metrics", False,
               "export ext_proc gRPC stream metrics (in-flight gauge, hold-duration histogram, completions by code)")
    _bool_flag(g, "--enable-pprof", True, "Go profiling handlers; no effect")
    _bool_flag(g, "--health-checking", False, "no effect: the health service always runs (--health-port -1: off)")
    g.add_argument("--refresh-prometheus-metrics-interval", type=duration_arg, default=None, metavar="DURATION",
                   help="no effect: EPP computes its pool gauges when /metrics is scraped")
    g.add_argument("--metrics-staleness-threshold", type=positive_duration_arg, default=None, metavar="DURATION",
                   help="metrics older than this mark an endpoint stale (default 2s)")
    g.add_argument("--model-server-metrics-path", type=_unquote, default=None, metavar="PATH",
                   help="model servers' metrics path (default /metrics)")
    g.add_argument("--model-server-metrics-scheme", type=_unquote, choices=["http", "https"], default=None)
    g.add_argument("--model-server-metrics-port", type=int, default=None, metavar="PORT",
                   help="deprecated in the reference: scrape this port when the pool has one target port")
    _bool_flag(g, "--model-server-metrics-https-insecure-skip-verify", True,
               "with https scraping, do not verify the servers' certificates")
    for dest in METRIC_FLAGS:
        g.add_argument("--" + dest.replace("_", "-"), type=_metric_spec, default=None, metavar="SPEC",
                       help="metric (name or name{label=value}) for the default engine; \"\" = not read")
    _add_server_flags(g)


def _add_server_flags(g: argparse._ArgumentGroup) -> None:
    """The reference's ext_proc server flags: the drain window, message size limits, plugin stability."""
    from epp.cli.argtypes import duration_arg

    g.add_argument("--drain-timeout", type=duration_arg, default=None, metavar="DURATION",
                   help="on SIGTERM, readiness goes NOT_SERVING and the Lease is released at once, but both front "
                        "ends keep serving, new requests included, this long before the --shutdown-grace stop "
                        "(a second signal ends it); default 30s with Kubernetes discovery, else 5s when ext_proc is "
                        "served (Envoy's health check must notice) and 0 for a gateway alone")
    for direction in ("recv", "send"):
        g.add_argument(f"--grpc-max-{direction}-msg-size", default="", metavar="SIZE",
                       help=f"largest ext_proc message to {'receive' if direction == 'recv' else 'send'}, a "
                            f"Kubernetes quantity (10MiB, 25MB); larger ones end the stream with RESOURCE_EXHAUSTED; "
                            f"default (or 0): the body limit plus 1 MiB")
    _bool_flag(g, "--allow-experimental-plugins", False, "no effect: EPP's plugins have no stability levels")
    _add_newer_flags(g)


def _add_newer_flags(g: argparse._ArgumentGroup) -> None:
    """Flags of the current reference's ``options.go``: scores metadata, label cap, TLS policy, feature gates."""
    from epp.cli.argtypes import duration_arg

    _bool_flag(g, "--emit-endpoint-scores", False,
               "also put every scored endpoint's score in ext_proc's envoy.lb metadata, under "
               f"{SCORES_KEY} (ip:port -> weighted score of the primary profile)")
    g.add_argument("--fairness-id-metric-label-limit", type=int, default=DEFAULT_FAIRNESS_ID_LIMIT, metavar="N",
                   help="distinct fairness_id label values metrics record; later new ones read 'other' (0: all "
                        "do); default 1000")
    g.add_argument("--plugin-state-staleness-threshold", type=duration_arg, default=None, metavar="DURATION",
                   help="must be positive; no effect: EPP frees a request's plugin state when the request ends, "
                        "so nothing is left to reap (reference default 5m)")
    g.add_argument("--tls-min-version", type=_unquote, default="", metavar="VERSION",
                   help="lowest TLS version the ext_proc port accepts: VersionTLS10 .. VersionTLS13 (native "
                        "transport)")
    g.add_argument("--tls-cipher-suites", type=_unquote, default="", metavar="LIST",
                   help="comma-separated Go cipher suite names the ext_proc port offers for TLS 1.2 and below "
                        "(TLS 1.3 suites are not configurable; native transport)")
    g.add_argument("--feature-gates", action="append", default=[], metavar="LIST",
                   help="comma-separated gates, name or name=true|false (a bare name enables it), applied after "
                        "the config's featureGates, so they win; may repeat")


@dataclass
class ReferenceSettings:
    """What the reference flags ask of EPP, in EPP's terms (None/empty: the flag was not given)."""

    config_text: str | None = None
    pool_namespace: str = "default"
    pool_group: str = POOL_GROUPS[0]
    plaintext: bool | None = None
    cert_files: tuple[str, str] | None = None
    cert_reload: bool = False
    leader_election: bool = False
    metrics_auth: bool | None = None
    """``--metrics-endpoint-auth`` as given; None: not given (on with Kubernetes discovery)."""
    metrics_cert_dir: str | None = None
    metrics_client_ca_file: str | None = None
    stream_metrics: bool = False
    scrape: dict[str, object] = field(default_factory=dict)
    """:class:`~epp.datalayer.ScrapeConfig` fields to replace (path, scheme, insecure_skip_verify, staleness)."""
    metrics_port: int | None = None
    engine_metrics: dict[str, str] = field(default_factory=dict)
    """:class:`~epp.datalayer.engines.EngineConfig` field -> spec text ("" = off) for the default engine."""
    drain_timeout: float | None = None
    """``--drain-timeout`` in seconds; None: not given (:attr:`epp.runtime.app.EppApp.drain_timeout` decides)."""
    grpc_max_recv: int = 0
    """``--grpc-max-recv-msg-size`` in bytes; 0: EPP's limit."""
    grpc_max_send: int = 0
    """``--grpc-max-send-msg-size`` in bytes; 0: EPP's limit."""
    emit_scores: bool = False
    fairness_id_limit: int = DEFAULT_FAIRNESS_ID_LIMIT
    tls_policy: TlsPolicy = field(default_factory=TlsPolicy)
    feature_gates: tuple[str, ...] = ()
    """``--feature-gates`` entries in order (each checked)."""
    tracing: bool | None = None
    """``--tracing`` as given; None: not given (on when the environment names an OTLP endpoint:
    :func:`epp.observability.otlp_configured`)."""
    log_level: int = logging.INFO
    log_json: bool = False
    log_time: str = "iso8601"
    warnings: list[str] = field(default_factory=list)


def reference_settings(args: argparse.Namespace, log_level_given: bool) -> ReferenceSettings:
    """Translate the parsed reference flags (``ValueError`` naming the flag if a value cannot be used)."""
    s = ReferenceSettings(config_text=args.config_text, pool_group=args.pool_group,
                          leader_election=bool(args.ha_enable_leader_election),
                          cert_reload=bool(args.enable_cert_reload))
    s.pool_namespace = args.pool_namespace or os.environ.get("NAMESPACE") or "default"
    if args.secure_serving is not None:
        s.plaintext = not args.secure_serving
    s.cert_files = _cert_files(args.cert_path, args.key_path)
    if s.cert_reload and s.cert_files is None:
        raise ValueError("--enable-cert-reload needs --cert-path")
    _scrape_settings(args, s)
    s.engine_metrics = {field_name: getattr(args, dest) for dest, field_name in METRIC_FLAGS.items()
                        if getattr(args, dest) is not None}
    _log_settings(args, s, log_level_given)
    s.tracing = args.tracing
    s.metrics_auth = args.metrics_endpoint_auth
    s.metrics_cert_dir, s.metrics_client_ca_file = _metrics_tls_files(args.metrics_cert_dir,
                                                                      args.metrics_client_ca_file)
    s.stream_metrics = bool(args.enable_grpc_stream_metrics)
    _server_settings(args, s)
    return s


def _metrics_tls_files(cert_dir: str | None, ca_file: str | None) -> tuple[str | None, str | None]:
    """The reference's ``Complete`` checks: each named file exists (empty values are "not given", as in Go)."""
    cert_dir, ca_file = cert_dir or None, ca_file or None
    paths = ([ca_file] if ca_file else []) + ([str(Path(cert_dir, n)) for n in ("tls.crt", "tls.key")]
                                               if cert_dir else [])
    for path in paths:
        try:
            os.stat(path)
        except OSError as exc:
            raise ValueError(f"metrics TLS cert file unreadable: {path}: {exc.strerror or exc}") from None
    return cert_dir, ca_file


def check_metrics_tls(cert_dir: str | None, ca_file: str | None, metrics_auth: bool, auth_given: bool) -> None:
    """The reference's ``Validate`` rules for metrics TLS (``ValueError``): a client CA needs ``--metrics-cert-dir``,
    and TLS without client certificates needs the bearer-token auth (``metrics_auth``: its effective value,
    ``auth_given``: whether the flag was given rather than defaulted), since TLS alone lets anyone scrape."""
    if ca_file and not cert_dir:
        raise ValueError("--metrics-client-ca-file requires --metrics-cert-dir")
    if cert_dir and not ca_file and not metrics_auth:
        hint = "" if auth_given else " (it is on by default only with Kubernetes discovery)"
        raise ValueError("--metrics-cert-dir enables metrics TLS without authentication; set "
                         f"--metrics-client-ca-file or --metrics-endpoint-auth{hint}")


def _server_settings(args: argparse.Namespace, s: ReferenceSettings) -> None:
    """The drain window and the message size limits (``ValueError`` with the reference's messages)."""
    from epp.config.units import parse_size_flag

    s.drain_timeout = args.drain_timeout
    _newer_settings(args, s)
    if args.grpc_max_recv_msg_size != "":
        s.grpc_max_recv = parse_size_flag("--grpc-max-recv-msg-size", args.grpc_max_recv_msg_size)
    if args.grpc_max_send_msg_size != "":
        s.grpc_max_send = parse_size_flag("--grpc-max-send-msg-size", args.grpc_max_send_msg_size)


def _newer_settings(args: argparse.Namespace, s: ReferenceSettings) -> None:
    """The current reference's newer flags, checked as its ``Complete``/``Validate`` check them (``ValueError``)."""
    from epp.config.feature_gates import FeatureGateError, parse_feature_gates
    from epp.config.tls import parse_cipher_suites, parse_tls_version

    s.emit_scores = bool(args.emit_endpoint_scores)
    if args.fairness_id_metric_label_limit < 0:
        raise ValueError(f"fairness-id-metric-label-limit must be non-negative, got "
                         f"{args.fairness_id_metric_label_limit}")
    s.fairness_id_limit = args.fairness_id_metric_label_limit
    threshold = args.plugin_state_staleness_threshold
    if threshold is not None and threshold <= 0:
        raise ValueError(f"plugin-state-staleness-threshold must be positive, got {threshold:g}s")
    s.tls_policy = TlsPolicy(parse_tls_version(args.tls_min_version) if args.tls_min_version else None,
                             parse_cipher_suites(args.tls_cipher_suites.split(",")))
    s.feature_gates = tuple(e.strip() for v in args.feature_gates for e in v.split(",") if e.strip())
    try:
        parse_feature_gates(s.feature_gates)
    except FeatureGateError as exc:
        raise ValueError(f"--feature-gates: {exc}") from None


def _cert_files(cert_path: str | None, key_path: str | None) -> tuple[str, str] | None:
    """The certificate and key: ``--cert-path DIR`` holds ``tls.crt`` and ``tls.key`` (the reference's form);
    ``--cert-path FILE --key-path FILE`` names them (EPP's form)."""
    if cert_path is None:
        if key_path is not None:
            raise ValueError("--key-path needs --cert-path")
        return None
    if Path(cert_path).is_dir():
        if key_path is not None:
            raise ValueError("--key-path cannot be used when --cert-path is a directory (it holds tls.key)")
        return str(Path(cert_path, "tls.crt")), str(Path(cert_path, "tls.key"))
    if key_path is None:
        raise ValueError(f"--cert-path {cert_path} is not a directory holding tls.crt and tls.key; give the key "
                         f"file with --key-path")
    return cert_path, key_path


def _scrape_settings(args: argparse.Namespace, s: ReferenceSettings) -> None:
    if args.model_server_metrics_path is not None:
        if not args.model_server_metrics_path.startswith("/"):
            raise ValueError(f"--model-server-metrics-path must start with '/': {args.model_server_metrics_path!r}")
        s.scrape["path"] = args.model_server_metrics_path
    if args.model_server_metrics_scheme is not None:
        s.scrape["scheme"] = args.model_server_metrics_scheme
    if args.model_server_metrics_https_insecure_skip_verify is not None:
        s.scrape["insecure_skip_verify"] = args.model_server_metrics_https_insecure_skip_verify
    if args.metrics_staleness_threshold is not None:
        s.scrape["staleness"] = args.metrics_staleness_threshold
    if args.model_server_metrics_port:
        if not 0 < args.model_server_metrics_port <= 65535:
            raise ValueError(f"--model-server-metrics-port {args.model_server_metrics_port} is out of range")
        s.metrics_port = args.model_server_metrics_port


def _log_settings(args: argparse.Namespace, s: ReferenceSettings, log_level_given: bool) -> None:
    s.log_json = args.zap_encoder == "json"
    if args.zap_time_encoding is not None:
        s.log_time = args.zap_time_encoding
    if log_level_given:
        s.log_level = logging.getLevelName(args.log_level.upper())
        if not isinstance(s.log_level, int):
            raise ValueError(f"--log-level: unknown level {args.log_level!r}")
    elif args.zap_log_level is not None:
        s.log_level = _zap_level(args.zap_log_level)
    elif args.zap_devel:
        s.log_level = logging.DEBUG
    elif args.v is not None:
        s.log_level = logging.DEBUG if args.v >= 4 else logging.INFO


def _zap_level(text: str) -> int:
    text = _unquote(text)
    if text.lower() in _ZAP_LEVELS:
        return _ZAP_LEVELS[text.lower()]
    try:
        verbosity = int(text)
    except ValueError:
        raise ValueError(f"--zap-log-level: unknown level {text!r} (debug, info, error, or a number)") from None
    return logging.DEBUG if verbosity >= 4 else logging.INFO
