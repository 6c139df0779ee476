"""An Envoy bootstrap that fronts a model-server pool with EPP as its ext_proc endpoint picker.

:func:`build_bootstrap` returns the bootstrap as a dict, :func:`render` as YAML. What it writes, and why
(``docs/extproc.md`` and the measured facts in ``shared/reference/envoy-extproc.md``):

* **Routing by dynamic metadata**, not by header: the pool cluster is ``ORIGINAL_DST`` reading
  ``envoy.lb``/``x-gateway-destination-endpoint-primary`` (one ``ip:port``; ORIGINAL_DST answers 503 to the
  protocol's comma-separated fallback list), and the ext_proc filter accepts that namespace
  (``metadata_options.receiving_namespaces`` — without it Envoy drops the metadata silently). A client's
  ``x-gateway-destination-endpoint`` header therefore never picks the upstream, with EPP up or down.
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
  STREAMED phases; Envoy's 200 ms default is tight for Python under load), HCM ``request_timeout`` bounding the
  request phase (FULL_DUPLEX_STREAMED has no message timeout). Circuit breakers are raised: every in-flight LLM
  request holds an ext_proc stream and an upstream request.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Literal

import yaml

__all__ = ["EnvoyConfigOptions", "EnvoyConfigError", "build_bootstrap", "render", "parse_hostport",
           "POOL_CLUSTER", "EPP_CLUSTER", "FALLBACK_CLUSTER", "LISTENER_NAME"]

POOL_CLUSTER = "inference-pool"
EPP_CLUSTER = "epp"
FALLBACK_CLUSTER = "inference-pool-fallback"
LISTENER_NAME = "inference-gateway"
_MAX = 1_000_000  # circuit-breaker limits: effectively unlimited


class EnvoyConfigError(ValueError):
    """Options that cannot make a working configuration."""


@dataclass(frozen=True)
class EnvoyConfigOptions:
    """Everything ``epp envoy-config`` can set; defaults match ``epp serve``'s defaults."""

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
    message_timeout_s: float = 5.0
    request_timeout_s: float = 120.0
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
        for addr in (self.listen, *self.epp, *self.fallback, *((self.admin,) if self.admin else ())):
            parse_hostport(addr)


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
            "message_timeout": _duration(opts.message_timeout_s),
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
    return header + yaml.safe_dump(build_bootstrap(opts), sort_keys=False, default_flow_style=False, width=120)
