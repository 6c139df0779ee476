"""``epp demo``: one command that starts a simulated pool, EPP (gateway + ext_proc) and Envoy, and shows it."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from epp.cli.argtypes import listen_port_arg, positive_arg
from epp.errors import ConfigError
from epp.runtime.demo import Demo, DemoOptions, format_report, run_traffic, snapshot_counts

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``demo``."""
    p = sub.add_parser("demo", help="run a simulated vLLM pool behind EPP (and Envoy, if installed)")
    d = DemoOptions()
    p.add_argument("--servers", type=positive_arg, default=d.servers, help="simulated vLLM servers")
    p.add_argument("--pd", action="store_true", help="prefill/decode roles with the disaggregation profile")
    p.add_argument("--config", help="EndpointPickerConfig (default: the reference default profile)")
    p.add_argument("--http-port", type=listen_port_arg, default=d.http_port)
    p.add_argument("--grpc-port", type=listen_port_arg, default=d.grpc_port)
    p.add_argument("--metrics-port", type=listen_port_arg, default=d.metrics_port)
    p.add_argument("--envoy-port", type=listen_port_arg, default=d.envoy_port)
    p.add_argument("--sim-base-port", type=listen_port_arg, default=d.sim_base_port, help="0 picks free ports")
    p.add_argument("--time-scale", type=float, default=d.time_scale,
                   help="wall seconds per simulated second (below 1 runs the simulated servers faster than real time)")
    p.add_argument("--no-envoy", action="store_true")
    p.add_argument("--traffic", action="store_true", help="drive a short mixed workload and print a summary")
    p.add_argument("--requests", type=positive_arg, default=120)
    p.add_argument("--concurrency", type=positive_arg, default=12)
    p.add_argument("--exit", action="store_true", help="stop after the workload instead of waiting for Ctrl-C")
    p.set_defaults(func=run)


async def _main(args: argparse.Namespace) -> None:
    demo = Demo(DemoOptions(servers=args.servers, pd=args.pd, config=args.config, http_port=args.http_port,
                            grpc_port=args.grpc_port, metrics_port=args.metrics_port, envoy_port=args.envoy_port,
                            sim_base_port=args.sim_base_port, time_scale=args.time_scale, envoy=not args.no_envoy))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await demo.start()  # inside the try: a part that fails to start stops the ones already running
        print(demo.banner(waits=not args.exit), flush=True)
        if args.traffic:
            urls = [demo.gateway_url] + ([demo.envoy_url] if demo.envoy_url else [])
            print(f"\nDriving {args.requests} streamed requests (concurrency {args.concurrency}) through "
                  f"{' and '.join(urls)} ...", flush=True)
            before = await snapshot_counts(demo)
            report = await run_traffic(urls, args.requests, args.concurrency)
            print("\n" + format_report(demo, report, before, await snapshot_counts(demo)), flush=True)
        if not args.exit:
            await stop.wait()
    finally:
        await demo.stop()


def run(args: argparse.Namespace) -> int:
    """Run the demo until Ctrl-C (or, with ``--exit``, until the workload is done)."""
    from epp.gateway import run as run_loop

    try:
        run_loop(_main(args))
    except (ConfigError, ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
