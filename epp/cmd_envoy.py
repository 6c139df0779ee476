"""``epp envoy-config``: print an Envoy bootstrap that uses EPP as its ext_proc endpoint picker.

Example::

    epp envoy-config --listen 0.0.0.0:8081 --epp 127.0.0.1:9002 > envoy.yaml
    envoy -c envoy.yaml

Several ``--epp`` addresses (repeated or comma-separated) list several EPP workers; Envoy spreads request
streams over them. See :mod:`epp.envoy_config` for what the bootstrap contains and why.
"""

from __future__ import annotations

import argparse
import sys

from .envoy_config import EnvoyConfigError, EnvoyConfigOptions, render

__all__ = ["add_parser", "run", "options_from_args"]


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
    p.add_argument("--message-timeout", type=float, default=d.message_timeout_s, metavar="SECONDS",
                   help=f"ext_proc per-message timeout, buffered/streamed phases (default {d.message_timeout_s:g})")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s, metavar="SECONDS",
                   help=f"bound on the request phase incl. EPP's decision (default {d.request_timeout_s:g})")
    p.add_argument("--access-log", action="store_true", help="log every request to stdout")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(func=run)


def options_from_args(args: argparse.Namespace) -> EnvoyConfigOptions:
    """The :class:`EnvoyConfigOptions` the parsed command line asks for."""
    d = EnvoyConfigOptions()
    return EnvoyConfigOptions(
        listen=args.listen, epp=_addresses(args.epp, d.epp), mode=args.mode, response_mode=args.response_mode,
        fail_open=args.fail_open, fallback=_addresses(args.fallback, ()), plaintext=args.plaintext,
        admin=args.admin or None, body_limit=args.body_limit, route_timeout_s=args.route_timeout,
        message_timeout_s=args.message_timeout, request_timeout_s=args.request_timeout,
        access_log=args.access_log)


def run(args: argparse.Namespace) -> int:
    """Print (or write) the bootstrap; exit 2 with a message for contradictory options."""
    try:
        text = render(options_from_args(args))
    except EnvoyConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0
