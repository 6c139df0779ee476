"""Seed 000's comparison on the simulator: batching, capacity-aware routing and capacity-aware placement.

A fleet of ``--nodes`` nodes (``--gpus`` GPU slots each) runs ``--servers`` simulated vLLM servers, one per node in
turn; at ``--scale-at`` seconds ``--add`` more replicas are placed. Co-located servers slow each other and the first
``--slow-nodes`` nodes are slower (:mod:`bench.placement_fleet` states the model). Per regime, the same requests:

- (a) ``rr+dynamic``: round-robin, each server batching dynamically (the simulator's ``batching="dynamic"``: a
  batch starts when ``--batch`` requests wait or the oldest waited ``--max-wait`` s, and runs to completion);
- (b) ``rr+static``: round-robin, static batching (a new batch as soon as the previous one is done);
- (c) ``epp+dynamic``: EPP's Director and scheduler (``--config``, default config/default.yaml) over endpoints
  scraped every ``--scrape`` seconds, dynamic batching;
- (d) ``epp+dynamic+extender``: (c), the scale-up placed by the scheduler extender's ``NodePlacer`` (filter, then
  the highest priority); (a)-(c) place it as kube-scheduler's default scoring does (the fewest pods).

``--batching continuous`` runs (a), (c) and (d) with vLLM's continuous (iteration-level) batching instead.

Workload (seeded): Poisson arrivals at each ``--rates`` value for ``--duration`` seconds; prompts uniform in
[128, 1024] tokens, all distinct; outputs 50% U[16, 64], 40% U[128, 256], 10% U[512, 1024] (bench.batching's mix).

Columns: output tok/s and req/s over the window [0, duration); TTFT p50/p99 over every request (one that never got
a token counts as infinitely late, printed ``inf``); slot util = batch slots holding a sequence / batch slots of the
servers present, time-weighted over the window; busy = share of server-time with a step running; completed and
failed (refused, or unfinished ``--drain`` seconds after the window); servers per node after the scale-up.

    python -m bench.placement --decisions                 # the docs/placement.md table, with the extender's scores
    python -m bench.placement --batching continuous --rates 32,64,96,128,160
    python -m bench.placement --quick                     # a smoke run of about 10 s
"""

from __future__ import annotations

import argparse
import math
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from bench.placement_fleet import Fleet, FleetSpec, Outcome, Placer, Request, Router
from bench.placement_policies import (
    DEFAULT_CONFIG,
    EppRouting,
    ExtenderPlacement,
    LeastRequested,
    RoundRobin,
    SimClock,
)
from epp.extender.placement import NodePlacer

__all__ = ["main", "workload", "run_regime", "Regime", "REGIMES", "format_row", "percentile"]


@dataclass(frozen=True)
class Regime:
    label: str  # the name with {mode} for the batching of the non-static regimes
    static: bool
    routing: str  # "round-robin" or "epp"
    placement: str  # "least-requested" or "extender"

    def name(self, mode: str) -> str:
        return self.label.format(mode=mode)

    def batching(self, mode: str) -> str:
        return "static" if self.static else mode


REGIMES = {
    "a": Regime("(a) rr+{mode}", False, "round-robin", "least-requested"),
    "b": Regime("(b) rr+static", True, "round-robin", "least-requested"),
    "c": Regime("(c) epp+{mode}", False, "epp", "least-requested"),
    "d": Regime("(d) epp+{mode}+extender", False, "epp", "extender"),
}


def workload(rate: float, duration: float, seed: int) -> list[Request]:
    """Poisson arrivals in [0, duration) with bench.batching's prompt and output length mix."""
    rng = random.Random(seed)
    out: list[Request] = []
    t = rng.expovariate(rate)
    while t < duration:
        prompt_len = rng.randint(128, 1024)
        kind = rng.random()
        if kind < 0.5:
            max_tokens = rng.randint(16, 64)
        elif kind < 0.9:
            max_tokens = rng.randint(128, 256)
        else:
            max_tokens = rng.randint(512, 1024)
        out.append(Request(t, prompt_len, max_tokens))
        t += rng.expovariate(rate)
    return out


def build(regime: Regime, mode: str, spec: FleetSpec, requests: list[Request], seed: int, config: Path,
          scrape: float) -> Fleet:
    """The fleet of one regime, its router and placer wired to one simulated clock."""
    clock = SimClock()
    router: Router
    placer: Placer = LeastRequested(seed)
    if regime.routing == "epp":
        epp = EppRouting(config, clock, seed, scrape)
        router = epp
        if regime.placement == "extender":
            placer = ExtenderPlacement(NodePlacer(epp.detector), epp.endpoints, seed)
    else:
        router = RoundRobin()
    return Fleet(spec, regime.batching(mode), router, placer, requests, clock.set)


def run_regime(key: str, mode: str, rate: float, spec: FleetSpec, seed: int, config: Path,
               scrape: float) -> Outcome:
    """Simulate regime ``key`` (``mode``: the batching of the non-static ones) at ``rate`` requests/s; a
    process-pool task, so everything it needs is an argument."""
    requests = workload(rate, spec.duration, seed)
    fleet = build(REGIMES[key], mode, spec, requests, seed, config, scrape)
    out = fleet.run()
    if isinstance(fleet.placer, ExtenderPlacement):
        out.decisions = fleet.placer.decisions
    return out


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q ≤ 1) of ``values``; nan for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def format_row(name: str, rate: float, spec: FleetSpec, out: Outcome) -> str:
    """One Markdown table row of ``out``."""
    nodes = " ".join(f"{out.per_node[n]}{'*' if spec.is_slow(n) else ''}" for n in spec.node_names())
    return (f"| {name} | {rate:g} | {out.output_tokens / out.duration:,.0f} | "
            f"{out.completed_in_window / out.duration:.2f} | {_secs(percentile(out.ttfts, 0.5))} | "
            f"{_secs(percentile(out.ttfts, 0.99))} | {out.slot_util:.1%} | {out.busy_share:.1%} | "
            f"{out.completed} | {out.failed} | {nodes} |")


def _secs(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.2f}"


HEADER = ("| regime | rate (req/s) | output tok/s | req/s | TTFT p50 (s) | TTFT p99 (s) | slot util | busy "
          "| completed | failed | servers per node (* slow) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="16,32,48,64", help="comma-separated Poisson rates (requests/s)")
    p.add_argument("--regimes", default="a,b,c,d")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals (the measured window)")
    p.add_argument("--drain", type=float, default=None, help="seconds after the window for the rest (default: "
                   "--duration)")
    p.add_argument("--scale-at", type=float, default=None, help="when the new replicas are placed (default: "
                   "half the duration)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus", type=int, default=4, help="GPU slots (servers) per node")
    p.add_argument("--servers", type=int, default=8, help="servers at the start")
    p.add_argument("--add", type=int, default=4, help="replicas added at the scale-up")
    p.add_argument("--slow-nodes", type=int, default=1)
    p.add_argument("--slowdown", type=float, default=0.5, help="a slow node's extra step time (0.5: 1.5x)")
    p.add_argument("--contention", type=float, default=0.1, help="extra step time per busy co-located server")
    p.add_argument("--batch", type=int, default=64, help="max_num_seqs, the static and dynamic batch size")
    p.add_argument("--batching", choices=("dynamic", "continuous"), default="dynamic",
                   help="batching of (a), (c) and (d): the simulator's dynamic batching, or vLLM's continuous")
    p.add_argument("--max-wait", type=float, default=0.25, help="dynamic batching's longest wait (s)")
    p.add_argument("--scrape", type=float, default=0.05, help="EPP's metrics refresh interval (s)")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="EPP's EndpointPickerConfig")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="worker processes (results do not depend on it)")
    p.add_argument("--decisions", action="store_true", help="after the table, the extender's scores and choices")
    p.add_argument("--quick", action="store_true", help="a smoke run: 20 s, rates 24 and 48")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.rates = 20.0, "24,48"
    return args


def fleet_spec(args: argparse.Namespace) -> FleetSpec:
    spec = FleetSpec(nodes=args.nodes, gpus=args.gpus, servers=args.servers, add=args.add,
                     slow_nodes=args.slow_nodes, slowdown=args.slowdown, contention=args.contention,
                     batch=args.batch, max_wait=args.max_wait, duration=args.duration)
    spec = replace(spec, drain=args.duration if args.drain is None else args.drain,
                   scale_at=args.duration / 2 if args.scale_at is None else args.scale_at)
    if spec.servers + spec.add > spec.nodes * spec.gpus:
        raise SystemExit(f"{spec.servers} + {spec.add} servers do not fit on {spec.nodes} nodes x {spec.gpus} GPUs")
    return spec


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spec = fleet_spec(args)
    rates = [float(r) for r in args.rates.split(",")]
    keys = args.regimes.split(",")
    cells = [(key, rate) for rate in rates for key in keys]
    print(f"{spec.nodes} nodes x {spec.gpus} GPUs ({spec.slow_nodes} slow: +{spec.slowdown:.0%} step time), "
          f"contention +{spec.contention:.0%} per busy neighbour; {spec.servers} servers, +{spec.add} at "
          f"{spec.scale_at:g} s; {args.batching} batching in (a), (c), (d); batch {spec.batch}, dynamic wait "
          f"{spec.max_wait:g} s; {spec.duration:g} s of "
          f"arrivals, drain {spec.drain:g} s; EPP scrape {args.scrape:g} s, config {args.config.name}; "
          f"seed {args.seed}\n")
    print(HEADER)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_regime, key, args.batching, rate, spec, args.seed, args.config, args.scrape)
                   for key, rate in cells]
        outcomes = []
        for (key, rate), future in zip(cells, futures):
            outcomes.append(future.result())
            print(format_row(REGIMES[key].name(args.batching), rate, spec, outcomes[-1]), flush=True)
    if args.decisions:
        print()
        for (key, rate), out in zip(cells, outcomes):
            for scores, node in out.decisions:
                shown = ", ".join(f"{n} {score}" for n, score in scores) or "one node left"
                print(f"({key}) at {rate:g} req/s: extender scores {shown} -> {node}")


if __name__ == "__main__":
    main()
