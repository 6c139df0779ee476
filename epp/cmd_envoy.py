"""``epp envoy-config``: print an Envoy bootstrap that uses EPP as its ext_proc endpoint picker.

Example::

    epp envoy-config --listen 0.0.0.0:8081 --epp 127.0.0.1:9002 > envoy.yaml
    envoy -c envoy.yaml

Several ``--epp`` addresses (repeated or comma-separated) list several EPP workers; Envoy spreads request
streams over them. ``--config`` names EPP's own config: with flow control on, Envoy's timeouts are sized for its
queue (the longest request TTL), and what they cannot cover is printed as a warning. See :mod:`epp.envoy_config`
for what the bootstrap contains and why.
"""

from __future__ import annotations

import argparse
import sys

from .config import config_error_text, load_config
from .envoy_config import EnvoyConfigError, EnvoyConfigOptions, render
from .errors import ConfigError
from .registry import default_registry

__all__ = ["add_parser", "run", "options_from_args", "queue_wait"]


def _addresses(values: list[str] | None, default: tuple[str, ...]) -> tuple[str, ...]:
    if not values:
        return default
    return tuple(a.strip() for v in values for a in v.split(",") if a.strip())


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
    p.add_argument("--admin", default=d.admin, metavar="HOST:PORT", help=f"Envoy admin address (default {d.admin})")
    p.add_argument("--body-limit", type=int, default=d.body_limit, metavar="BYTES",
                   help="largest request body (buffered mode sizes Envoy's buffer for it; default 10 MiB)")
    p.add_argument("--route-timeout", type=float, default=d.route_timeout_s, metavar="SECONDS",
                   help=f"upstream (LLM call) timeout (default {d.route_timeout_s:g})")
    p.add_argument("--config", metavar="FILE",
                   help="EPP's EndpointPickerConfig: size the timeouts below for its flow-control queue")
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


def options_from_args(args: argparse.Namespace, queue_wait_s: float | None = None) -> EnvoyConfigOptions:
    """The :class:`EnvoyConfigOptions` the parsed command line asks for (``queue_wait_s``: see there)."""
    d = EnvoyConfigOptions()
    return EnvoyConfigOptions(
        listen=args.listen, epp=_addresses(args.epp, d.epp), mode=args.mode, response_mode=args.response_mode,
        fail_open=args.fail_open, fallback=_addresses(args.fallback, ()), plaintext=args.plaintext,
        admin=args.admin or None, body_limit=args.body_limit, route_timeout_s=args.route_timeout,
        message_timeout_s=args.message_timeout, request_timeout_s=args.request_timeout,
        idle_timeout_s=args.idle_timeout, queue_wait_s=queue_wait_s, access_log=args.access_log)


def queue_wait(config_path: str) -> float | None:
    """The longest time EPP's flow control may hold a request under the config at ``config_path``: the largest
    queue-wait budget (``defaultRequestTTL``, tenants' ``requestTTL``, ``noEndpointRequestTTL``; 0: one of them has
    none, so the wait is unbounded); None when the flowControl gate is off (nothing is queued). ``ConfigError`` if
    the config is bad."""
    from .flowcontrol.base import FLOW_CONTROL_GATE
    from .flowcontrol.budget import longest_queue_wait
    from .flowcontrol.config import FlowControlConfig

    pipeline = load_config(config_path, default_registry())
    if FLOW_CONTROL_GATE not in pipeline.feature_gates:
        return None
    return longest_queue_wait(pipeline.flow_control or FlowControlConfig())


_BUFFERED_NOTE = ("note: in buffered mode Envoy gives EPP --message-timeout ({:g} s) to answer a request body, and "
                  "EPP answers only once its flow control admitted the request: one queued longer gets 504 from "
                  "Envoy (with --fail-open it goes to the fallback, past flow control). Pass --config with EPP's "
                  "config to size it from the flow-control TTL, or set --message-timeout.")


def run(args: argparse.Namespace) -> int:
    """Print (or write) the bootstrap, warnings on stderr; exit 2 with a message for contradictory options."""
    try:
        opts = options_from_args(args, queue_wait(args.config) if args.config else None)
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
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0
