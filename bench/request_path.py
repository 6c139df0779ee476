"""Request-path benchmark, in process: what EPP's Director costs per request, and what its metrics cost.

Part 1 runs the Director's whole lifecycle for one request (parse the body, admit and schedule, response
started, response complete) over 4 endpoints, with the round-robin-like profile (``random-picker`` only) and the
reference's default profile, without metrics and with EPP's Prometheus metrics wired as ``epp serve`` wires them
(plugin timers included). Part 2 times the metric operations one proxied request makes (about twenty counter
increments and histogram observations) on prometheus-client's own instruments and on :mod:`epp.metrics.instruments`,
side by side.

With ``--chunks N`` each request also streams N chunks after the first (the Director's ``stream_chunk``, which runs
the plugins' chunk hooks); ``--config FILE`` (repeatable) adds a profile to the two.

Usage: python -m bench.request_path [--requests N] [--chunks N] [--config FILE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bench.gateway_load import request_body
from bench.http_gateway import RR_CONFIG
from epp.config.loader import DEFAULT_CONFIG_TEXT, build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.framework.endpoint import EndpointSpec
from epp.framework.plugins import ResponseInfo
from epp.metrics.families import EppMetrics
from epp.metrics.instruments import counter, gauge, histogram
from epp.runtime.app import instrument_pipeline
from epp.runtime.builtins import default_registry
from epp.scheduling.director import Director

_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60)


async def lifecycle_us(config: str, with_metrics: bool, requests: int, chunks: int = 0) -> float:
    """µs per request of parse + route + response_started + ``chunks`` x stream_chunk + response_complete."""
    datastore = Datastore()
    datastore.replace_all([EndpointSpec(f"s{i}", "127.0.0.1", 8000 + i) for i in range(4)])
    datastore.mark_synced()
    pipeline = build_pipeline(*load_raw(config), default_registry())
    metrics = None
    if with_metrics:
        metrics = EppMetrics(CollectorRegistry())
        instrument_pipeline(pipeline, metrics)
    director = Director(pipeline, datastore, metrics=metrics)
    bodies = [request_body(i, True) for i in range(64)]
    headers = {"content-type": "application/json"}
    info = ResponseInfo(status=200, prompt_tokens=300, completion_tokens=16, cached_tokens=0, streamed=True)
    elapsed = 0.0
    for count in (requests // 10, requests):  # warm-up, then measured
        start = time.perf_counter()
        for i in range(count):
            request = director.parse("/v1/chat/completions", bodies[i % 64], headers)
            ctx = await director.route(request)
            director.response_started(ctx)
            for _ in range(chunks):
                director.stream_chunk(ctx)
            director.response_complete(ctx, info)
        elapsed = time.perf_counter() - start
    return elapsed / requests * 1e6


def metric_ops_us(ours: bool, requests: int) -> float:
    """µs per request-equivalent of metric operations: 3 counter increments, 2 gauge updates, 9 observations."""
    registry = CollectorRegistry()
    labels = ("model_name", "target_model_name")
    if ours:
        c, g, h = (counter("c", "c", labels, registry=registry), gauge("g", "g", labels, registry=registry),
                   histogram("h", "h", labels, buckets=_BUCKETS, registry=registry))
    else:
        c, g, h = (Counter("c", "c", labels, registry=registry), Gauge("g", "g", labels, registry=registry),
                   Histogram("h", "h", labels, buckets=_BUCKETS, registry=registry))
    cc, gc, hc = c.labels("m", "m"), g.labels("m", "m"), h.labels("m", "m")
    start = time.perf_counter()
    for _ in range(requests):
        cc.inc()
        cc.inc()
        cc.inc()
        gc.inc()
        gc.dec()
        for value in (0.001, 0.02, 0.3, 16.0, 300.0, 0.0001, 0.002, 0.04, 1.5):
            hc.observe(value)
    return (time.perf_counter() - start) / requests * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.request_path", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--chunks", type=int, default=0, help="streamed chunks per request after the first")
    parser.add_argument("--config", type=Path, action="append", default=[], help="another profile to measure")
    args = parser.parse_args(argv)
    print(f"Director lifecycle per request (parse, route, started, {args.chunks} chunks, complete), 4 endpoints:")
    profiles = [("round-robin", RR_CONFIG), ("default", DEFAULT_CONFIG_TEXT)]
    profiles += [(path.stem, path.read_text()) for path in args.config]
    for name, config in profiles:
        bare = asyncio.run(lifecycle_us(config, False, args.requests, args.chunks))
        instrumented = asyncio.run(lifecycle_us(config, True, args.requests, args.chunks))
        print(f"  {name:<12} no metrics {bare:6.1f} µs   with EPP's metrics {instrumented:6.1f} µs   "
              f"(metrics: {instrumented - bare:+.1f} µs)")
    theirs, ours = metric_ops_us(False, args.requests), metric_ops_us(True, args.requests)
    print(f"Metric operations of one request: prometheus-client {theirs:.1f} µs, epp.metrics.instruments {ours:.1f} µs "
          f"({theirs / ours:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
