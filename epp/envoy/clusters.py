"""The clusters of an Envoy bootstrap: the model-server pool, EPP's ext_proc and xDS services, the fail-open fallback.

:func:`clusters` returns them for an :class:`~epp.envoy.options.EnvoyConfigOptions`. The pool cluster either takes
its members from EPP over EDS and lets the ``override_host`` policy walk EPP's endpoint list under
:data:`DESTINATION_KEY` (``lb="override-host"``), or connects to the one target EPP names under
:data:`~epp.headers.PRIMARY_KEY` (``lb="original-dst"``). EPP's clusters speak HTTP/2 (TLS without verification
unless ``plaintext``) and are health-checked on EPP's gRPC health port when it is known, so that a draining EPP
gets no new ext_proc streams.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from epp.envoy.options import EnvoyConfigOptions, parse_hostport
from epp.envoy.values import duration, socket_address, typed
from epp.headers import DESTINATION_HEADER, HEADER_ALIASES, PRIMARY_KEY

__all__ = ["clusters", "POOL_CLUSTER", "EPP_CLUSTER", "XDS_CLUSTER", "FALLBACK_CLUSTER", "EXT_PROC_SERVICE",
           "DESTINATION_KEY", "HEALTH_UNHEALTHY_THRESHOLD"]

POOL_CLUSTER = "inference-pool"
EPP_CLUSTER = "epp"
XDS_CLUSTER = "epp-xds"
FALLBACK_CLUSTER = "inference-pool-fallback"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
DESTINATION_KEY = HEADER_ALIASES[DESTINATION_HEADER]
"""The ``envoy.lb`` key holding EPP's endpoint list (target first, then fallbacks): the protocol's name, which the
override_host policy's documentation uses. EPP also writes it as ``x-llm-d-router-destination-endpoint``; only
one is read, since the policy would walk a list read from two sources twice."""
_MAX = 1_000_000  # circuit-breaker limits: effectively unlimited


def clusters(opts: EnvoyConfigOptions) -> list[dict[str, Any]]:
    """The bootstrap's static clusters for ``opts``: the pool and EPP, then xDS (override-host) and the fallback
    (fail-open with fallback addresses)."""
    found = [_pool_cluster(opts), _epp_cluster(opts)]
    if opts.lb == "override-host":
        found.append(_grpc_cluster(XDS_CLUSTER, opts.xds_addresses, opts))
    if opts.fail_open and opts.fallback:
        found.append(_static_cluster(FALLBACK_CLUSTER, opts.fallback, 5.0))
    return found


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _thresholds(retries: int = 3) -> dict[str, Any]:
    return {"thresholds": [{"max_connections": _MAX, "max_pending_requests": _MAX, "max_requests": _MAX,
                            "max_retries": retries}]}


def _static_cluster(name: str, addresses: tuple[str, ...], connect_timeout: float) -> dict[str, Any]:
    dns = any(not _is_ip(parse_hostport(a)[0]) for a in addresses)
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STRICT_DNS" if dns else "STATIC",
        "connect_timeout": duration(connect_timeout),
        "lb_policy": "ROUND_ROBIN",
        "circuit_breakers": _thresholds(),
        "load_assignment": {"cluster_name": name, "endpoints": [
            {"lb_endpoints": [{"endpoint": {"address": socket_address(a)}} for a in addresses]}]},
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
    interval = duration(opts.health_interval_s)
    check: dict[str, Any] = {
        "timeout": duration(min(1.0, opts.health_interval_s)), "interval": interval,
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


def _pool_cluster(opts: EnvoyConfigOptions) -> dict[str, Any]:
    cluster: dict[str, Any] = {"name": POOL_CLUSTER, "connect_timeout": "5s"}
    if opts.lb == "original-dst":
        return {**cluster, "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED", "circuit_breakers": _thresholds(),
                "original_dst_lb_config": {"metadata_key": _lb_key(PRIMARY_KEY)}}
    round_robin = typed("envoy.load_balancing_policies.round_robin",
                        "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin")
    override = typed("envoy.load_balancing_policies.override_host",
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
