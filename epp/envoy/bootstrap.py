"""An Envoy bootstrap that fronts a model-server pool with EPP as its ext_proc endpoint picker.

:func:`build_bootstrap` returns the bootstrap as a dict, :func:`render` as YAML. Contract (the why, measured, is in
``docs/extproc.md``): Envoy routes only by the ``envoy.lb`` metadata EPP sets, never by a client header; only the
paths EPP's parsers claim (``suffixes``), ``GET /v1/models`` and ``allow_paths`` reach the pool, everything else
gets a JSON 404 from Envoy without asking EPP; every answer Envoy makes itself carries an OpenAI-style JSON error
(Anthropic's for ``/v1/messages``) from :mod:`epp.errors`, and EPP's own answers pass unchanged. With
``lb="override-host"`` (``epp envoy-config``'s default) the pool cluster's members come from EPP over EDS
(:mod:`epp.envoy.xds`) and the ``override_host`` policy walks EPP's endpoint list on retries, then a round robin over the
pool; with ``lb="original-dst"`` (this class's default, for Envoy before 1.35 or an EPP without ``--xds-port``)
Envoy connects to EPP's first endpoint and never retries elsewhere.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import yaml

from epp.errors import (BadRequest, EppError, InternalError, NoCandidates, NotFound, PayloadTooLarge, SchedulingFailed,
                     UpstreamError, UpstreamTimeout, error_body)

__all__ = ["EnvoyConfigOptions", "EnvoyConfigError", "build_bootstrap", "render", "parse_hostport",
           "POOL_CLUSTER", "EPP_CLUSTER", "XDS_CLUSTER", "FALLBACK_CLUSTER", "LISTENER_NAME", "QUEUE_MARGIN_S",
           "MAX_MESSAGE_TIMEOUT_S", "DEFAULT_XDS_PORT", "INFERENCE_SUFFIXES", "MODELS_PATH", "DESTINATION_KEY",
           "PRIMARY_KEY", "RETRY_ON", "LbPolicy"]

POOL_CLUSTER = "inference-pool"
EPP_CLUSTER = "epp"
XDS_CLUSTER = "epp-xds"
DEFAULT_XDS_PORT = 18000
"""Where ``epp envoy-config`` expects EPP's EDS server (``epp serve --xds-port``) unless ``--xds`` says."""
DESTINATION_KEY = "x-gateway-destination-endpoint"
"""The ``envoy.lb`` key holding EPP's endpoint list (target first, then fallbacks): the protocol's name, which the
override_host policy's documentation uses. EPP also writes it as ``x-llm-d-router-destination-endpoint``; only
one is read, since the policy would walk a list read from two sources twice."""
PRIMARY_KEY = "x-gateway-destination-endpoint-primary"
"""EPP's own ``envoy.lb`` key with the target alone: ORIGINAL_DST cannot read a list."""
INFERENCE_SUFFIXES = (
    "chat/completions", "completions", "embeddings", "responses", "conversations", "chat/completions/render",
    "completions/render", "images/generations", "images/edits", "audio/speech", "videos", "videos/sync",
    "messages", "messages/count_tokens", "messages/render")
"""The path suffixes ``openai-parser`` and ``anthropic-parser`` claim: what EPP's default parser reads."""
MODELS_PATH = "/v1/models"
RETRY_ON = "connect-failure,refused-stream,reset,retriable-status-codes"
"""Retried (to the next endpoint): the model server never answered, or answered 503. A reset counts even after
the request was sent: nothing reached the client, and an LLM request has no side effect to repeat."""
RETRY_AFTER_S = 1
"""``retry-after`` on Envoy's own 503s (EPP or every model server unreachable: a restart takes seconds)."""
FALLBACK_CLUSTER = "inference-pool-fallback"
LISTENER_NAME = "inference-gateway"
NODE_ID = "epp-envoy"
_MAX = 1_000_000  # circuit-breaker limits: effectively unlimited
_RE2_PROGRAM_SIZE = 4096
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
_EXT_PROC = "envoy.filters.http.ext_proc"
_EXT_PROC_TYPE = "envoy.extensions.filters.http.ext_proc.v3.ExtProc"
DEFAULT_MESSAGE_TIMEOUT_S = 5.0
DEFAULT_IDLE_TIMEOUT_S = 300.0
"""Envoy's default HCM ``stream_idle_timeout``."""
QUEUE_MARGIN_S = 5.0
"""Added to the flow-control wait: EPP answers an expired request within its dispatch tick, then Envoy relays it."""
MAX_MESSAGE_TIMEOUT_S = 3600.0
"""Envoy's upper bound on the ext_proc ``message_timeout`` (the field's validation rule)."""


LbPolicy = Literal["override-host", "original-dst"]


class EnvoyConfigError(ValueError):
    """Options that cannot make a working configuration."""


@dataclass(frozen=True)
class EnvoyConfigOptions:
    """Everything ``epp envoy-config`` can set; defaults match ``epp serve``'s defaults.

    ``message_timeout_s``/``idle_timeout_s`` of None are derived (:attr:`message_timeout`,
    :attr:`idle_timeout`). ``queue_wait_s`` is the longest time EPP's flow control may hold a request before
    answering it (its largest request TTL; 0: no TTL, it waits as long as Envoy does; None: no flow control, or
    not known). ``xds`` lists EPP's EDS server(s) (empty: the first ``epp`` host on :data:`DEFAULT_XDS_PORT`);
    ``retries`` bounds the further endpoints one request may try (override-host only); ``suffixes`` are the
    claimed path suffixes routed for ``POST``; ``allow_paths`` are further exact paths routed for any method.
    """

    listen: str = "0.0.0.0:8081"
    epp: tuple[str, ...] = ("127.0.0.1:9002",)
    mode: Literal["full-duplex", "buffered"] = "full-duplex"
    response_mode: Literal["streamed", "full-duplex", "none"] = "streamed"
    fail_open: bool = False
    fallback: tuple[str, ...] = ()
    plaintext: bool = False
    admin: str | None = "127.0.0.1:9901"
    body_limit: int = 10 << 20
    route_timeout_s: float = 300.0
    message_timeout_s: float | None = None
    request_timeout_s: float = 120.0
    idle_timeout_s: float | None = None
    queue_wait_s: float | None = None
    epp_connect_timeout_s: float = 2.0
    access_log: bool = False
    lb: LbPolicy = "original-dst"
    """The library default needs nothing from EPP; ``epp envoy-config`` defaults to ``override-host``."""
    xds: tuple[str, ...] = ()
    retries: int = 3
    suffixes: tuple[str, ...] = INFERENCE_SUFFIXES
    allow_paths: tuple[str, ...] = ()
    epp_health_port: int | None = None
    """EPP's gRPC health port (``epp serve --health-port``): Envoy health-checks every ``epp`` address on it and
    sends new ext_proc streams to the SERVING ones. None (the library default; ``epp envoy-config`` defaults to
    9003, ``epp serve``'s): no health checks."""
    health_interval_s: float = 1.0

    def check(self) -> None:
        """Raise :class:`EnvoyConfigError` for contradictory options."""
        if not self.epp:
            raise EnvoyConfigError("at least one --epp address is needed")
        if self.response_mode == "none" and self.mode == "full-duplex":
            raise EnvoyConfigError(
                "--response-mode none needs --mode buffered: with a FULL_DUPLEX_STREAMED request body and no "
                "response phase Envoy ends the ext_proc stream right after EPP's routing reply, so EPP would "
                "release the request (in-flight counts, flow-control slot, running requests) while the model "
                "server is still answering")
        if self.fail_open and self.mode == "full-duplex":
            raise EnvoyConfigError(
                "--fail-open needs --mode buffered: Envoy ignores failure_mode_allow for FULL_DUPLEX_STREAMED "
                "bodies (an unreachable EPP gives 500 either way)")
        if self.fallback and not self.fail_open:
            raise EnvoyConfigError("--fallback is only used with --fail-open")
        if self.body_limit <= 0:
            raise EnvoyConfigError("--body-limit must be positive")
        if self.message_timeout_s is not None and not 0 < self.message_timeout_s <= MAX_MESSAGE_TIMEOUT_S:
            raise EnvoyConfigError(f"--message-timeout must be in (0, {MAX_MESSAGE_TIMEOUT_S:g}] (Envoy's range)")
        if self.xds and self.lb != "override-host":
            raise EnvoyConfigError("--xds is only used with --lb override-host")
        if self.epp_health_port is not None and not 0 < self.epp_health_port <= 65535:
            raise EnvoyConfigError("--epp-health-port must be a port (1-65535)")
        if not 0 < self.health_interval_s <= 60:
            raise EnvoyConfigError("--health-interval must be in (0, 60] seconds")
        if not 0 <= self.retries <= 10:
            raise EnvoyConfigError("--retries must be from 0 to 10")
        if not self.suffixes:
            raise EnvoyConfigError("no inference path to route")
        for path in self.allow_paths:
            if not path.startswith("/") or "?" in path or "#" in path:
                raise EnvoyConfigError(f"--allow-path takes a path such as /tokenize, got {path!r}")
        for addr in (self.listen, *self.epp, *self.fallback, *self.xds, *((self.admin,) if self.admin else ())):
            parse_hostport(addr)

    @property
    def xds_addresses(self) -> tuple[str, ...]:
        """Where Envoy asks for the pool's endpoints: ``xds``, else the first EPP host on the default port."""
        if self.xds:
            return self.xds
        host = parse_hostport(self.epp[0])[0]
        return (f"[{host}]:{DEFAULT_XDS_PORT}" if ":" in host else f"{host}:{DEFAULT_XDS_PORT}",)

    @property
    def idle_timeout(self) -> float:
        """The HCM ``stream_idle_timeout`` (0: none): as given, else Envoy's 5 min raised to the route timeout (a
        non-streamed answer is silent until it is done) and to the queue wait plus a margin (so is a queued one)."""
        if self.idle_timeout_s is not None:
            return self.idle_timeout_s
        wait = self.queue_wait_s or 0.0
        return max(DEFAULT_IDLE_TIMEOUT_S, self.route_timeout_s, wait + QUEUE_MARGIN_S if wait > 0 else 0.0)

    @property
    def message_timeout(self) -> float:
        """The ext_proc ``message_timeout``: as given, else 5 s. In buffered mode EPP answers the body only once
        admitted, so a known queue wait raises it to :meth:`_queue_bound`, at most Envoy's 1 h."""
        if self.message_timeout_s is not None:
            return self.message_timeout_s
        if self.mode != "buffered" or self.queue_wait_s is None:
            return DEFAULT_MESSAGE_TIMEOUT_S
        return min(max(DEFAULT_MESSAGE_TIMEOUT_S, self._queue_bound()), MAX_MESSAGE_TIMEOUT_S)

    def _queue_bound(self) -> float:
        """How long Envoy must let EPP hold a request: the queue wait plus a margin; with no TTL, as long as the
        idle timeout lets the request live (so that it, not the message timeout, ends the wait)."""
        wait = self.queue_wait_s or 0.0
        return wait + QUEUE_MARGIN_S if wait > 0 else self.idle_timeout or MAX_MESSAGE_TIMEOUT_S

    def warnings(self) -> list[str]:
        """What these timeouts cannot do for EPP's flow-control queue (``queue_wait_s``); empty when all is well."""
        wait = self.queue_wait_s
        if wait is None:
            return []
        out = []
        bound, idle = self._queue_bound(), self.idle_timeout
        if wait == 0 and idle:
            out.append(f"EPP's flow control has no request TTL (0: wait as long as the client does); Envoy ends a "
                       f"request still queued after its stream idle timeout, {idle:g} s, with 504 'stream timeout'")
        elif 0 < idle < bound:
            out.append(f"the stream idle timeout ({idle:g} s) is shorter than EPP's longest flow-control wait "
                       f"({wait:g} s): Envoy answers a request still queued then with 504 'stream timeout' instead "
                       f"of EPP's own answer (429 or 503)")
        if self.mode == "buffered" and self.message_timeout < bound:
            bypass = " and, with --fail-open, sends it to the fallback, past flow control" if self.fail_open else ""
            limit = "; Envoy allows at most 1 h, use --mode full-duplex" if bound > MAX_MESSAGE_TIMEOUT_S else ""
            out.append(f"buffered mode: Envoy waits at most --message-timeout {self.message_timeout:g} s for EPP to "
                       f"answer a request body, less than a request may be queued ({bound:g} s): Envoy then answers "
                       f"504 with an empty body instead of EPP's 429 or 503{bypass}{limit}")
        return out


def parse_hostport(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); :class:`EnvoyConfigError` if malformed."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise EnvoyConfigError(f"expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _socket(value: str) -> dict[str, Any]:
    host, port = parse_hostport(value)
    return {"socket_address": {"address": host, "port_value": port}}


def _duration(seconds: float) -> str:
    return f"{seconds:g}s"


def _thresholds(retries: int = 3) -> dict[str, Any]:
    return {"thresholds": [{"max_connections": _MAX, "max_pending_requests": _MAX, "max_requests": _MAX,
                            "max_retries": retries}]}


def _static_cluster(name: str, addresses: tuple[str, ...], connect_timeout: float) -> dict[str, Any]:
    dns = any(not _is_ip(parse_hostport(a)[0]) for a in addresses)
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STRICT_DNS" if dns else "STATIC",
        "connect_timeout": _duration(connect_timeout),
        "lb_policy": "ROUND_ROBIN",
        "circuit_breakers": _thresholds(),
        "load_assignment": {"cluster_name": name, "endpoints": [
            {"lb_endpoints": [{"endpoint": {"address": _socket(a)}} for a in addresses]}]},
    }
    if dns:
        cluster["dns_lookup_family"] = "V4_PREFERRED"
    return cluster


def _grpc_cluster(name: str, addresses: tuple[str, ...], opts: EnvoyConfigOptions) -> dict[str, Any]:
    """A cluster of EPP's gRPC ports: HTTP/2 (an HTTP/1 cluster passes validation, then fails every call), TLS
    without verification unless ``plaintext`` (EPP's default certificate is self-signed)."""
    cluster = _static_cluster(name, addresses, opts.epp_connect_timeout_s)
    cluster["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }}
    if not opts.plaintext:
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {"alpn_protocols": ["h2"]},
            }}
    return cluster


_PLAINTEXT_MATCH = {"epp-health": "plaintext"}
HEALTH_UNHEALTHY_THRESHOLD = 2
"""Failed checks (timeouts, refused connections) before Envoy stops opening ext_proc streams to an EPP; a
NOT_SERVING answer marks it unhealthy at once. ``epp serve``'s drain (``epp.runtime.app.EXTPROC_DRAIN_TIMEOUT``, 5 s)
outlasts one 1 s interval, a check that times out on a busy replica, and the next one."""


def _epp_cluster(opts: EnvoyConfigOptions) -> dict[str, Any]:
    """EPP's ext_proc cluster, health-checked on EPP's gRPC health port when that is known.

    The check asks for the ext_proc service's status, which EPP turns NOT_SERVING as soon as it starts draining
    (SIGTERM), before it stops accepting streams; Envoy then opens new streams on the other replicas only. The
    health port is plaintext even when ext_proc is TLS, hence the transport-socket match. ``no_traffic_interval``
    is Envoy's 60 s by default: an idle Envoy would notice a restart a minute late."""
    cluster = _grpc_cluster(EPP_CLUSTER, opts.epp, opts)
    cluster["circuit_breakers"] = _thresholds(_MAX)  # one dead EPP turns every stream opening at once into a retry
    if opts.epp_health_port is None:
        return cluster
    for lb_endpoint in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]:
        lb_endpoint["endpoint"]["health_check_config"] = {"port_value": opts.epp_health_port}
    interval = _duration(opts.health_interval_s)
    check: dict[str, Any] = {
        "timeout": _duration(min(1.0, opts.health_interval_s)), "interval": interval,
        "no_traffic_interval": interval, "unhealthy_interval": interval,
        "unhealthy_threshold": HEALTH_UNHEALTHY_THRESHOLD, "healthy_threshold": 1,
        "grpc_health_check": {"service_name": EXT_PROC_SERVICE},
        "always_log_health_check_failures": True,
    }
    if not opts.plaintext:
        check["transport_socket_match_criteria"] = _PLAINTEXT_MATCH
        cluster["transport_socket_matches"] = [{"name": "epp-health-plaintext", "match": _PLAINTEXT_MATCH,
                                                "transport_socket": {
                                                    "name": "envoy.transport_sockets.raw_buffer", "typed_config": {
                                                        "@type": "type.googleapis.com/envoy.extensions."
                                                                 "transport_sockets.raw_buffer.v3.RawBuffer"}}}]
    cluster["health_checks"] = [check]
    return cluster


def _lb_key(key: str) -> dict[str, Any]:
    return {"key": "envoy.lb", "path": [{"key": key}]}


def _typed(name: str, type_name: str, **config: Any) -> dict[str, Any]:
    return {"name": name, "typed_config": {"@type": f"type.googleapis.com/{type_name}", **config}}


def _pool_cluster(opts: EnvoyConfigOptions) -> dict[str, Any]:
    cluster: dict[str, Any] = {"name": POOL_CLUSTER, "connect_timeout": "5s"}
    if opts.lb == "original-dst":
        return {**cluster, "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED", "circuit_breakers": _thresholds(),
                "original_dst_lb_config": {"metadata_key": _lb_key(PRIMARY_KEY)}}
    round_robin = _typed("envoy.load_balancing_policies.round_robin",
                         "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin")
    override = _typed("envoy.load_balancing_policies.override_host",
                      "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                      override_host_sources=[{"metadata": _lb_key(DESTINATION_KEY)}],
                      fallback_policy={"policies": [{"typed_extension_config": round_robin}]})
    return {
        **cluster,
        "type": "EDS",
        "circuit_breakers": _thresholds(_MAX),  # a dead pod makes every request to it a retry at once
        "eds_cluster_config": {"service_name": POOL_CLUSTER, "eds_config": {
            "resource_api_version": "V3",
            "api_config_source": {"api_type": "GRPC", "transport_api_version": "V3",
                                  "set_node_on_first_message_only": True,
                                  "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER, "retry_policy": {
                                      # reconnect soon after an EPP restart (Envoy keeps the endpoints meanwhile)
                                      "retry_back_off": {"base_interval": "0.5s", "max_interval": "5s"}}}}]}}},
        "load_balancing_policy": {"policies": [{"typed_extension_config": override}]},
    }


def _ext_proc_filter(opts: EnvoyConfigOptions) -> dict[str, Any]:
    full_duplex = opts.mode == "full-duplex"
    response_duplex = opts.response_mode == "full-duplex"
    response_none = opts.response_mode == "none"
    return {
        "name": _EXT_PROC,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": EPP_CLUSTER}, "retry_policy": _epp_retry_policy()},
            "failure_mode_allow": opts.fail_open,
            "message_timeout": _duration(opts.message_timeout),
            "processing_mode": {
                "request_header_mode": "SEND",
                "request_body_mode": "FULL_DUPLEX_STREAMED" if full_duplex else "BUFFERED",
                "request_trailer_mode": "SEND" if full_duplex else "SKIP",
                "response_header_mode": "SKIP" if response_none else "SEND",
                "response_body_mode": ("FULL_DUPLEX_STREAMED" if response_duplex else
                                       "NONE" if response_none else "STREAMED"),
                "response_trailer_mode": "SEND" if response_duplex else "SKIP",
            },
            "response_attributes": ["upstream.address"],  # the endpoint that served, after any retry
            "metadata_options": {
                "receiving_namespaces": {"untyped": ["envoy.lb"]},
                "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint"]},
            },
        },
    }


def _epp_retry_policy() -> dict[str, Any]:
    """Open the ext_proc stream on another EPP when one is gone (killed, or restarting between health checks).

    It has to sit on ``grpc_service`` itself: Envoy ignores a ``retry_policy`` under ``envoy_grpc`` for ext_proc
    streams. ``previous_hosts`` keeps a retry off the EPP that just failed; a stream already under way when its EPP
    dies is not retried (its request fails), which is what a SIGKILL costs."""
    return {
        "retry_on": "connect-failure,refused-stream,reset",
        "num_retries": 2,
        "retry_back_off": {"base_interval": "0.01s", "max_interval": "0.05s"},
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3."
                                      "PreviousHostsPredicate"}}],
        "host_selection_retry_max_attempts": 3,
    }


def _method(regex: str) -> dict[str, Any]:
    return {"name": ":method", "string_match": {"safe_regex": {"regex": regex}}}


def _inference_matches(opts: EnvoyConfigOptions) -> list[dict[str, Any]]:
    """What reaches the pool: ``POST`` to a claimed suffix (as EPP's parser registry matches it: at the end of the
    path, one trailing ``/`` allowed), ``GET``/``HEAD /v1/models``, and the allowed extra paths."""
    claims = "|".join(re.escape(s.strip("/")) for s in dict.fromkeys(opts.suffixes))
    matches: list[dict[str, Any]] = [
        {"safe_regex": {"regex": f".*(?:{claims})/?"}, "headers": [_method("POST")]},
        {"path": MODELS_PATH, "headers": [_method("GET|HEAD")]},
    ]
    return matches + [{"path": path} for path in dict.fromkeys(opts.allow_paths)]


def _retry_policy(opts: EnvoyConfigOptions) -> dict[str, Any]:
    """Up to ``retries`` further attempts, each to a host not tried yet: with override_host the next endpoint of
    EPP's list, then the fallback round robin."""
    return {"retry_on": RETRY_ON, "retriable_status_codes": [503], "num_retries": opts.retries,
            "retry_host_predicate": [_typed("envoy.retry_host_predicates.previous_hosts",
                                            "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate")],
            "host_selection_retry_max_attempts": 5,
            "retry_back_off": {"base_interval": "0.01s", "max_interval": "0.1s"}}


def _cluster_route(cluster: str, opts: EnvoyConfigOptions, retry: bool) -> dict[str, Any]:
    route: dict[str, Any] = {"cluster": cluster, "timeout": _duration(opts.route_timeout_s)}
    if retry and opts.retries:
        route["retry_policy"] = _retry_policy(opts)
    return route


def _routes(opts: EnvoyConfigOptions) -> list[dict[str, Any]]:
    """EPP's decision (its metadata) routes an inference path to the pool. Before EPP answered, and when it did not
    route (fail-open), the same path matches the second set: the fallback cluster or a 503. Any other path gets a
    404 from Envoy with ext_proc disabled, so model-server admin routes stay unreachable and EPP is not asked."""
    key = PRIMARY_KEY if opts.lb == "original-dst" else DESTINATION_KEY
    decided = {"dynamic_metadata": [{"filter": "envoy.lb", "path": [{"key": key}],
                                     "value": {"present_match": True}}]}
    pool = _cluster_route(POOL_CLUSTER, opts, retry=opts.lb == "override-host")
    undecided: dict[str, Any]
    if opts.fail_open and opts.fallback:
        undecided = {"route": _cluster_route(FALLBACK_CLUSTER, opts, retry=True)}
    else:
        undecided = {"direct_response": {"status": 503, "body": {"inline_string": "no endpoint was picked for "
                                                                                 "this request"}}}
    matches = _inference_matches(opts)
    no_ext_proc = {_EXT_PROC: {"@type": f"type.googleapis.com/{_EXT_PROC_TYPE}PerRoute", "disabled": True}}
    return [*({"match": {**m, **decided}, "route": pool} for m in matches),
            *({"match": m, **undecided} for m in matches),
            {"match": {"prefix": "/"}, "direct_response": {"status": 404}, "typed_per_filter_config": no_ext_proc}]


def _cel(expression: str) -> dict[str, Any]:
    return {"extension_filter": _typed("envoy.access_loggers.extension_filters.cel",
                                       "envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
                                       expression=expression)}


_EPP_ANSWER = "response.code_details.startsWith('epp_')"
"""EPP's ImmediateResponses carry ``details`` ``epp_<code>`` (:func:`epp.extproc.protocol.immediate_error`)."""
_EPP_FAILED = "response.code_details.startsWith('ext_proc_error')"
_MESSAGES_PATH = "^[^?]*/messages/?([?].*)?$"
"""A ``:path`` whose errors take Anthropic's envelope (:func:`epp.framework.request.is_messages_path`)."""


def _envoy_replies() -> list[tuple[str, EppError, int | None]]:
    """Envoy's own answers, first match wins: (CEL condition, the error whose body it gets, status to set).
    Messages are Envoy format strings: they keep the body Envoy would have sent and its response code details,
    which tell, for example, a model server that never answered from one that died after starting its answer."""
    told = "%LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)"
    return [
        (f"{_EPP_FAILED} && response.code == 504",
         UpstreamTimeout("the endpoint picker (EPP) did not answer in time (%RESPONSE_CODE_DETAILS%)",
                         reason="EndpointPickerTimeout"), None),
        (_EPP_FAILED, NoCandidates("the endpoint picker (EPP) is unavailable (%RESPONSE_CODE_DETAILS%)"), 503),
        ("response.code == 404", NotFound("no route for %REQ(:METHOD)% %REQ(:PATH)%"), None),
        ("response.code == 413", PayloadTooLarge(told), None),
        ("response.code == 429", SchedulingFailed(told), None),
        ("response.code == 502", UpstreamError(told), None),
        ("response.code == 503", NoCandidates(told), None),
        ("response.code == 504", UpstreamTimeout(told), None),
        ("response.code < 500", BadRequest(told), None),
        ("true", InternalError(told), None),
    ]


def _local_reply_config() -> dict[str, Any]:
    """JSON errors for what Envoy answers itself (a 503 with ``retry-after`` when trying again helps); EPP's own
    answers pass unchanged."""
    mappers: list[dict[str, Any]] = [{"filter": _cel(_EPP_ANSWER)}]
    for anthropic in (True, False):
        for condition, err, status in _envoy_replies():
            condition = f"{condition} && request.path.matches('{_MESSAGES_PATH}')" if anthropic else condition
            mapper: dict[str, Any] = {"filter": _cel(condition), "body_format_override": {
                "json_format": orjson.loads(error_body(err, anthropic=anthropic))}}
            if status is not None:
                mapper["status_code"] = status
            if (status or err.status) == 503:
                mapper["headers_to_add"] = [{"header": {"key": "retry-after", "value": str(RETRY_AFTER_S)},
                                             "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]
            mappers.append(mapper)
    return {"mappers": mappers}


def build_bootstrap(opts: EnvoyConfigOptions) -> dict[str, Any]:
    """The Envoy bootstrap for ``opts`` as a dict (``EnvoyConfigError`` for contradictory options)."""
    opts.check()
    buffered = opts.mode == "buffered"
    hcm: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                 "HttpConnectionManager",
        "stat_prefix": "inference",
        "codec_type": "AUTO",
        "request_timeout": _duration(opts.request_timeout_s),
        "stream_idle_timeout": _duration(opts.idle_timeout),
        "normalize_path": True,  # "/v1/../sleep" is "/sleep": the 404 route, not an inference path
        "merge_slashes": True,
        "local_reply_config": _local_reply_config(),
        "route_config": {"name": "inference", "virtual_hosts": [
            {"name": "inference", "domains": ["*"], "routes": _routes(opts)}]},
        "http_filters": [
            _ext_proc_filter(opts),
            {"name": "envoy.filters.http.router",
             "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
        ],
    }
    if opts.access_log:
        hcm["access_log"] = [{"name": "envoy.access_loggers.stdout", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog"}}]
    listener: dict[str, Any] = {
        "name": LISTENER_NAME,
        "address": _socket(opts.listen),
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": hcm}]}],
    }
    if buffered:
        # BUFFERED holds the whole body in Envoy: allow the largest body EPP accepts (it answers 413 above).
        listener["per_connection_buffer_limit_bytes"] = opts.body_limit + (1 << 20)
    clusters = [_pool_cluster(opts), _epp_cluster(opts)]
    if opts.lb == "override-host":
        clusters.append(_grpc_cluster(XDS_CLUSTER, opts.xds_addresses, opts))
    if opts.fail_open and opts.fallback:
        clusters.append(_static_cluster(FALLBACK_CLUSTER, opts.fallback, 5.0))
    bootstrap: dict[str, Any] = {"node": {"id": NODE_ID, "cluster": NODE_ID},  # xDS needs both
                                 "static_resources": {"listeners": [listener], "clusters": clusters}}
    # One regex holds every claimed suffix: above RE2's default program-size limit of 100 for Envoy.
    bootstrap["layered_runtime"] = {"layers": [{"name": "static", "static_layer": {
        "re2.max_program_size.error_level": _RE2_PROGRAM_SIZE}}]}
    if opts.admin:
        bootstrap = {"admin": {"address": _socket(opts.admin)}, **bootstrap}
    return bootstrap


def render(opts: EnvoyConfigOptions) -> str:
    """The bootstrap for ``opts`` as YAML, with a header comment saying how it was made."""
    header = ("# Envoy bootstrap generated by `epp envoy-config`: EPP (ext_proc) picks the endpoint, Envoy routes\n"
              f"# by envoy.lb dynamic metadata. Request body {opts.mode}, response body {opts.response_mode}, "
              f"{'fail-open' if opts.fail_open else 'fail-closed'}.\n")
    if opts.lb == "override-host":
        header += (f"# The pool's endpoints come from EPP's xDS server ({', '.join(opts.xds_addresses)}: epp serve "
                   f"--xds-port); a failed endpoint is retried up to {opts.retries} times on another.\n")
    else:
        header += "# ORIGINAL_DST: Envoy connects to the endpoint EPP picked; no retry on another.\n"
    if opts.queue_wait_s is not None:
        wait = f"{opts.queue_wait_s:g} s" if opts.queue_wait_s else "unbounded (no TTL)"
        header += (f"# Sized for EPP's flow-control queue (longest wait {wait}): stream_idle_timeout "
                   f"{opts.idle_timeout:g}s, ext_proc message_timeout {opts.message_timeout:g}s.\n")
    return header + yaml.safe_dump(build_bootstrap(opts), sort_keys=False, default_flow_style=False, width=120)
