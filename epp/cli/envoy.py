"""``epp envoy-config``: print an Envoy bootstrap that uses EPP as its ext_proc endpoint picker.

Example::

    epp envoy-config --listen 0.0.0.0:8081 --epp 127.0.0.1:9002 > envoy.yaml
    envoy -c envoy.yaml

Several ``--epp`` addresses (repeated or comma-separated) list several EPP workers; Envoy spreads request
streams over them. With ``--lb override-host`` (the default) Envoy learns the pool from EPP's xDS server (``epp
serve --xds-port``) and retries a failed endpoint on the next one. ``--config`` names EPP's own config: Envoy then
routes the paths its parsers claim, and with flow control on, Envoy's timeouts are sized for its queue (the longest
request TTL); what they cannot cover is printed as a warning. See :mod:`epp.envoy.bootstrap` for the bootstrap.
"""

from __future__ import annotations

import argparse
import sys

from epp.config.loader import Pipeline, config_error_text, load_config
from epp.envoy.bootstrap import DEFAULT_XDS_PORT, INFERENCE_SUFFIXES, EnvoyConfigError, EnvoyConfigOptions, render
from epp.errors import ConfigError
from epp.runtime.builtins import default_registry
from epp.scheduling.parsers import claims_of

__all__ = ["add_parser", "run", "options_from_args", "queue_wait", "claimed_suffixes"]


def _addresses(values: list[str] | None, default: tuple[str, ...]) -> tuple[str, ...]:
    if not values:
        return default
    return tuple(a.strip() for v in values for a in v.split(",") if a.strip())


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``envoy-config``."""
    d = EnvoyConfigOptions()
    p = sub.add_parser("envoy-config", help="print an Envoy bootstrap that routes through EPP (ext_proc)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default=d.listen, metavar="HOST:PORT", help=f"Envoy listener (default {d.listen})")
    p.add_argument("--epp", action="append", metavar="HOST:PORT[,HOST:PORT...]",
                   help=f"EPP ext_proc address, repeatable or comma-separated (default {d.epp[0]})")
    p.add_argument("--mode", choices=("full-duplex", "buffered"), default=d.mode,
                   help="request body mode: full-duplex (FULL_DUPLEX_STREAMED, the reference's) or buffered")
    p.add_argument("--response-mode", choices=("streamed", "full-duplex", "none"), default=d.response_mode,
                   help="response body mode (default streamed: EPP acknowledges chunks without echoing them; "
                        "none: no response phase, fewest messages, but no usage/status/TTFT; needs --mode "
                        "buffered)")
    p.add_argument("--fail-open", action="store_true",
                   help="if EPP is unreachable, continue (needs --mode buffered); to --fallback or a 503")
    p.add_argument("--fallback", action="append", metavar="HOST:PORT[,HOST:PORT...]",
                   help="with --fail-open: pool endpoints to round-robin over while EPP is down")
    p.add_argument("--plaintext", action="store_true", help="EPP serves without TLS (epp serve --plaintext)")
    p.add_argument("--lb", choices=("override-host", "original-dst"), default="override-host",
                   help="override-host (default; Envoy >= 1.35): the pool is an EDS cluster fed by EPP (epp serve "
                        "--xds-port) and a failed endpoint is retried on EPP's next one, then on another pool "
                        "member; original-dst: Envoy connects to EPP's pick, no retries (older Envoys)")
    p.add_argument("--xds", action="append", metavar="HOST:PORT[,HOST:PORT...]",
                   help=f"EPP's xDS server (epp serve --xds-port; default: the first --epp host, port "
                        f"{DEFAULT_XDS_PORT})")
    p.add_argument("--retries", type=int, default=d.retries, metavar="N",
                   help=f"override-host: further endpoints a request may try after a connect failure, a reset "
                        f"before the answer or a 503 (default {d.retries}; 0 = none)")
    p.add_argument("--allow-path", action="append", metavar="PATH",
                   help="route this exact path (any method) to the pool too, e.g. /tokenize; repeatable. By "
                        "default only the paths EPP's parsers claim and GET /v1/models are routed: every other "
                        "path, the model servers' admin routes included, gets a JSON 404 from Envoy")
    p.add_argument("--epp-health-port", type=int, default=9003, metavar="PORT",
                   help="EPP's gRPC health port (epp serve --health-port; default 9003): Envoy "
                        "health-checks each --epp address there and opens ext_proc streams on SERVING ones only, so "
                        "a draining EPP (SIGTERM) stops getting requests before it stops; 0 = no health checks")
    p.add_argument("--health-interval", type=float, default=d.health_interval_s, metavar="SECONDS",
                   help=f"EPP health-check interval (default {d.health_interval_s:g}; an EPP is avoided after 2 "
                        "failed checks)")
    p.add_argument("--admin", default=d.admin, metavar="HOST:PORT", help=f"Envoy admin address (default {d.admin})")
    p.add_argument("--body-limit", type=int, default=d.body_limit, metavar="BYTES",
                   help="largest request body (buffered mode sizes Envoy's buffer for it; default 10 MiB)")
    p.add_argument("--route-timeout", type=float, default=d.route_timeout_s, metavar="SECONDS",
                   help=f"upstream (LLM call) timeout (default {d.route_timeout_s:g})")
    p.add_argument("--config", metavar="FILE",
                   help="EPP's EndpointPickerConfig: route the paths its parsers claim, and size the timeouts "
                        "below for its flow-control queue")
    p.add_argument("--message-timeout", type=float, metavar="SECONDS",
                   help="ext_proc per-message timeout, buffered/streamed phases (default 5; buffered with --config "
                        "and flow control: the longest request TTL + 5)")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s, metavar="SECONDS",
                   help=f"bound on receiving the client's request (default {d.request_timeout_s:g}; Envoy stops it "
                        "once the request is in: it bounds neither EPP's decision nor its queue)")
    p.add_argument("--idle-timeout", type=float, metavar="SECONDS",
                   help="stream idle timeout: ends a request while no byte moves, queued in EPP or awaiting a "
                        "non-streamed answer (default: 300, raised to --route-timeout and, with --config, to the "
                        "longest request TTL + 5)")
    p.add_argument("--access-log", action="store_true", help="log every request to stdout")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(func=run)


def options_from_args(args: argparse.Namespace, queue_wait_s: float | None = None,
                      suffixes: tuple[str, ...] = INFERENCE_SUFFIXES) -> EnvoyConfigOptions:
    """The :class:`EnvoyConfigOptions` the parsed command line asks for (``queue_wait_s``, ``suffixes``: see
    there)."""
    d = EnvoyConfigOptions()
    return EnvoyConfigOptions(
        listen=args.listen, epp=_addresses(args.epp, d.epp), mode=args.mode, response_mode=args.response_mode,
        fail_open=args.fail_open, fallback=_addresses(args.fallback, ()), plaintext=args.plaintext,
        admin=args.admin or None, body_limit=args.body_limit, route_timeout_s=args.route_timeout,
        message_timeout_s=args.message_timeout, request_timeout_s=args.request_timeout,
        idle_timeout_s=args.idle_timeout, queue_wait_s=queue_wait_s, access_log=args.access_log, lb=args.lb,
        xds=_addresses(args.xds, ()), retries=args.retries, suffixes=suffixes,
        allow_paths=tuple(args.allow_path or ()), epp_health_port=args.epp_health_port or None,
        health_interval_s=args.health_interval)


def claimed_suffixes(pipeline: Pipeline) -> tuple[str, ...]:
    """The path suffixes Envoy routes for EPP's config: those of EPP's default parser (the OpenAI and Anthropic
    APIs), then every claim of the configured parsers (``passthrough-parser`` claims none: ``--allow-path``)."""
    parsers = getattr(pipeline.parser, "parsers", None) or (pipeline.parser,)
    claims = (claim for parser in parsers for claim in claims_of(parser))
    return tuple(dict.fromkeys((*INFERENCE_SUFFIXES, *claims)))


def queue_wait(config_path: str) -> float | None:
    """The longest time EPP's flow control may hold a request under the config at ``config_path``: the largest
    queue-wait budget (``defaultRequestTTL``, tenants' ``requestTTL``, ``noEndpointRequestTTL``; 0: one of them has
    none, so the wait is unbounded); None when the flowControl gate is off (nothing is queued). ``ConfigError`` if
    the config is bad."""
    return _queue_wait(load_config(config_path, default_registry()))


def _queue_wait(pipeline: Pipeline) -> float | None:
    from epp.flowcontrol.base import FLOW_CONTROL_GATE
    from epp.flowcontrol.budget import longest_queue_wait
    from epp.flowcontrol.config import FlowControlConfig

    if FLOW_CONTROL_GATE not in pipeline.feature_gates:
        return None
    return longest_queue_wait(pipeline.flow_control or FlowControlConfig())


_BUFFERED_NOTE = ("note: in buffered mode Envoy gives EPP --message-timeout ({:g} s) to answer a request body, and "
                  "EPP answers only once its flow control admitted the request: one queued longer gets 504 from "
                  "Envoy (with --fail-open it goes to the fallback, past flow control). Pass --config with EPP's "
                  "config to size it from the flow-control TTL, or set --message-timeout.")


_XDS_NOTE = ("note: Envoy learns the pool's endpoints from EPP's xDS server at {} (run epp serve with --xds-port "
             "on that port); until it answers, Envoy waits up to 15 s to start, then every request gets 503. "
             "--lb original-dst needs no xDS.")


def run(args: argparse.Namespace) -> int:
    """Print (or write) the bootstrap, warnings on stderr; exit 2 with a message for contradictory options."""
    try:
        pipeline = load_config(args.config, default_registry()) if args.config else None
        opts = (options_from_args(args, _queue_wait(pipeline), claimed_suffixes(pipeline)) if pipeline is not None
                else options_from_args(args))
        text = render(opts)
    except EnvoyConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"error: --config: {config_error_text(exc)}", file=sys.stderr)
        return 2
    for warning in opts.warnings():
        print(f"warning: {warning}", file=sys.stderr)
    if opts.mode == "buffered" and not args.config and args.message_timeout is None:
        print(_BUFFERED_NOTE.format(opts.message_timeout), file=sys.stderr)
    if opts.lb == "override-host":
        print(_XDS_NOTE.format(",".join(opts.xds_addresses)), file=sys.stderr)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0
