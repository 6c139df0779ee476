"""An Envoy bootstrap that fronts a model-server pool with EPP as its ext_proc endpoint picker.

:func:`build_bootstrap` returns the bootstrap as a dict, :func:`render` as YAML. What it writes, and why
(``docs/extproc.md`` and the measured facts in ``shared/reference/envoy-extproc.md``):

* **Routing by dynamic metadata**, not by header: the pool cluster is ``ORIGINAL_DST`` reading
  ``envoy.lb``/``x-gateway-destination-endpoint-primary`` (one ``ip:port``; ORIGINAL_DST answers 503 to the
  protocol's comma-separated fallback list), and the ext_proc filter accepts that namespace
  (``metadata_options.receiving_namespaces`` — without it Envoy drops the metadata silently). A client's
  destination header (``x-llm-d-router-destination-endpoint`` or the deprecated ``x-gateway-destination-endpoint``)
  therefore never picks the upstream, with EPP up or down.
* The pool route only matches when that metadata is present; otherwise the request goes to the fail-open
  fallback cluster (``--fail-open --fallback``) or gets a 503 — never to a client-chosen or looping address.
* **Request body** ``FULL_DUPLEX_STREAMED`` (the reference's mode; ``request_trailer_mode: SEND`` is mandatory) or
  ``BUFFERED`` (route in the body reply; needs the listener buffer raised for large prompts). Fail-open only
  works with ``BUFFERED``: Envoy ignores ``failure_mode_allow`` in FULL_DUPLEX_STREAMED, so that combination is
  refused.
* **Response**: headers are sent (status, SSE, served endpoint via the ``upstream.address`` attribute), the body
  ``STREAMED`` by default (EPP answers each chunk with a bare CONTINUE instead of echoing it back, and
  small bodies arrive as one message) or ``FULL_DUPLEX_STREAMED`` as the reference. ``none`` sends no response
  phase at all (half the gRPC messages) and needs a ``BUFFERED`` request body: then Envoy keeps the stream open
  until the request is over, which is all EPP needs for in-flight counts (token usage, status, TTFT, the model-name
  restore and PreRequest response headers are lost). With a ``FULL_DUPLEX_STREAMED`` request body Envoy resets the
  stream right after EPP's routing reply, so EPP would release the request while the model server still answers:
  that combination is refused.
* The ext_proc cluster is **HTTP/2** (an HTTP/1 cluster passes validation but fails every request), TLS without
  verification unless ``--plaintext`` (EPP's default certificate is self-signed), one endpoint per EPP worker
  (Envoy spreads streams over them; one address would pin all streams to one HTTP/2 connection).
* Timeouts: route 300 s (LLM calls; the default 15 s is too short), ext_proc ``message_timeout`` (BUFFERED and
  STREAMED phases; Envoy's 200 ms default is tight for Python under load), HCM ``request_timeout`` (receiving the
  client's request: Envoy 1.40 stops it once the request is in, so it bounds neither EPP's decision nor its queue)
  and HCM ``stream_idle_timeout`` (Envoy's 5 min, raised to the route timeout: a non-streamed answer is silent
  until done). EPP answers a request only once its flow control admitted it, and a queued request is silent too,
  so the idle timeout and (BUFFERED) the message timeout must outlast the longest queue wait (``queue_wait_s``,
  the largest request TTL): they are raised to it when it is known, and :meth:`EnvoyConfigOptions.warnings` names
  what cannot be covered. Circuit breakers are raised: every in-flight LLM request holds an ext_proc stream and an
  upstream request.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Literal

import yaml

__all__ = ["EnvoyConfigOptions", "EnvoyConfigError", "build_bootstrap", "render", "parse_hostport",
           "POOL_CLUSTER", "EPP_CLUSTER", "FALLBACK_CLUSTER", "LISTENER_NAME", "QUEUE_MARGIN_S",
           "MAX_MESSAGE_TIMEOUT_S"]

POOL_CLUSTER = "inference-pool"
EPP_CLUSTER = "epp"
FALLBACK_CLUSTER = "inference-pool-fallback"
LISTENER_NAME = "inference-gateway"
_MAX = 1_000_000  # circuit-breaker limits: effectively unlimited
DEFAULT_MESSAGE_TIMEOUT_S = 5.0
DEFAULT_IDLE_TIMEOUT_S = 300.0
"""Envoy's default HCM ``stream_idle_timeout``."""
QUEUE_MARGIN_S = 5.0
"""Added to the flow-control wait: EPP answers an expired request within its dispatch tick, then Envoy relays it."""
MAX_MESSAGE_TIMEOUT_S = 3600.0
"""Envoy's upper bound on the ext_proc ``message_timeout`` (the field's validation rule)."""


class EnvoyConfigError(ValueError):
    """Options that cannot make a working configuration."""


@dataclass(frozen=True)
class EnvoyConfigOptions:
    """Everything ``epp envoy-config`` can set; defaults match ``epp serve``'s defaults.

    ``message_timeout_s``/``idle_timeout_s`` of None are derived (:attr:`message_timeout`,
    :attr:`idle_timeout`). ``queue_wait_s`` is the longest time EPP's flow control may hold a request before
    answering it (its largest request TTL; 0: no TTL, it waits as long as Envoy does; None: no flow control, or
    not known).
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
        for addr in (self.listen, *self.epp, *self.fallback, *((self.admin,) if self.admin else ())):
            parse_hostport(addr)


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


def _thresholds() -> dict[str, Any]:
    return {"thresholds": [{"max_connections": _MAX, "max_pending_requests": _MAX, "max_requests": _MAX,
                            "max_retries": 3}]}


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


def _epp_cluster(opts: EnvoyConfigOptions) -> dict[str, Any]:
    cluster = _static_cluster(EPP_CLUSTER, opts.epp, opts.epp_connect_timeout_s)
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


def _pool_cluster(opts: EnvoyConfigOptions) -> dict[str, Any]:
    return {
        "name": POOL_CLUSTER,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "5s",
        "circuit_breakers": _thresholds(),
        "original_dst_lb_config": {"metadata_key": {
            "key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint-primary"}]}},
    }


def _ext_proc_filter(opts: EnvoyConfigOptions) -> dict[str, Any]:
    full_duplex = opts.mode == "full-duplex"
    response_duplex = opts.response_mode == "full-duplex"
    response_none = opts.response_mode == "none"
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": EPP_CLUSTER}},
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
            "response_attributes": ["upstream.address"],
            "metadata_options": {
                "receiving_namespaces": {"untyped": ["envoy.lb"]},
                "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint"]},
            },
        },
    }


def _routes(opts: EnvoyConfigOptions) -> list[dict[str, Any]]:
    routed = {
        "match": {"prefix": "/", "dynamic_metadata": [{
            "filter": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint-primary"}],
            "value": {"present_match": True}}]},
        "route": {"cluster": POOL_CLUSTER, "timeout": _duration(opts.route_timeout_s)},
    }
    if opts.fail_open and opts.fallback:
        unrouted: dict[str, Any] = {"match": {"prefix": "/"},
                                    "route": {"cluster": FALLBACK_CLUSTER, "timeout": _duration(opts.route_timeout_s)}}
    else:
        body = ('{"error":{"message":"no endpoint was picked for this request","type":"server_error",'
                '"param":null,"code":"ServiceUnavailable"}}')
        unrouted = {"match": {"prefix": "/"},
                    "direct_response": {"status": 503, "body": {"inline_string": body}}}
    return [routed, unrouted]


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
    if opts.fail_open and opts.fallback:
        clusters.append(_static_cluster(FALLBACK_CLUSTER, opts.fallback, 5.0))
    bootstrap: dict[str, Any] = {"static_resources": {"listeners": [listener], "clusters": clusters}}
    if opts.admin:
        bootstrap = {"admin": {"address": _socket(opts.admin)}, **bootstrap}
    return bootstrap


def render(opts: EnvoyConfigOptions) -> str:
    """The bootstrap for ``opts`` as YAML, with a header comment saying how it was made."""
    header = ("# Envoy bootstrap generated by `epp envoy-config`: EPP (ext_proc) picks the endpoint, Envoy routes\n"
              f"# by envoy.lb dynamic metadata. Request body {opts.mode}, response body {opts.response_mode}, "
              f"{'fail-open' if opts.fail_open else 'fail-closed'}.\n")
    if opts.queue_wait_s is not None:
        wait = f"{opts.queue_wait_s:g} s" if opts.queue_wait_s else "unbounded (no TTL)"
        header += (f"# Sized for EPP's flow-control queue (longest wait {wait}): stream_idle_timeout "
                   f"{opts.idle_timeout:g}s, ext_proc message_timeout {opts.message_timeout:g}s.\n")
    return header + yaml.safe_dump(build_bootstrap(opts), sort_keys=False, default_flow_style=False, width=120)
