"""The request path through an Envoy bootstrap: the ext_proc filter that asks EPP, and the route table.

:func:`ext_proc_filter` sends every request to EPP (request headers, the body in ``opts.mode``, the response as
``opts.response_mode`` says) and lets it set ``envoy.lb`` metadata. :func:`routes` routes by that metadata only,
never by a client header: ``POST`` to a claimed path suffix, ``GET``/``HEAD /v1/models`` and the allowed extra paths
go to the pool once EPP decided (else to the fail-open fallback, or a 503); every other path gets Envoy's 404
without asking EPP. A failed attempt is retried on the next endpoint of EPP's list (override-host).
"""

from __future__ import annotations

import re
from typing import Any

from epp.envoy.clusters import DESTINATION_KEY, EPP_CLUSTER, FALLBACK_CLUSTER, POOL_CLUSTER
from epp.envoy.options import EnvoyConfigOptions
from epp.envoy.values import duration, typed
from epp.headers import PRIMARY_KEY

__all__ = ["ext_proc_filter", "routes", "MODELS_PATH", "RETRY_ON", "EXT_PROC_FILTER"]

MODELS_PATH = "/v1/models"
RETRY_ON = "connect-failure,refused-stream,reset,retriable-status-codes"
"""Retried (to the next endpoint): the model server never answered, or answered 503. A reset counts even after
the request was sent: nothing reached the client, and an LLM request has no side effect to repeat."""
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
_EXT_PROC_TYPE = "envoy.extensions.filters.http.ext_proc.v3.ExtProc"


def ext_proc_filter(opts: EnvoyConfigOptions) -> dict[str, Any]:
    full_duplex = opts.mode == "full-duplex"
    response_duplex = opts.response_mode == "full-duplex"
    response_none = opts.response_mode == "none"
    return {
        "name": EXT_PROC_FILTER,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": EPP_CLUSTER}, "retry_policy": _epp_retry_policy()},
            "failure_mode_allow": opts.fail_open,
            "message_timeout": duration(opts.message_timeout),
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
            "retry_host_predicate": [typed("envoy.retry_host_predicates.previous_hosts",
                                           "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate")],
            "host_selection_retry_max_attempts": 5,
            "retry_back_off": {"base_interval": "0.01s", "max_interval": "0.1s"}}


def _cluster_route(cluster: str, opts: EnvoyConfigOptions, retry: bool) -> dict[str, Any]:
    route: dict[str, Any] = {"cluster": cluster, "timeout": duration(opts.route_timeout_s)}
    if retry and opts.retries:
        route["retry_policy"] = _retry_policy(opts)
    return route


def routes(opts: EnvoyConfigOptions) -> list[dict[str, Any]]:
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
    no_ext_proc = {EXT_PROC_FILTER: {"@type": f"type.googleapis.com/{_EXT_PROC_TYPE}PerRoute", "disabled": True}}
    return [*({"match": {**m, **decided}, "route": pool} for m in matches),
            *({"match": m, **undecided} for m in matches),
            {"match": {"prefix": "/"}, "direct_response": {"status": 404}, "typed_per_filter_config": no_ext_proc}]
