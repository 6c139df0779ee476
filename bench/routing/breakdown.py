"""``python -m bench.routing.breakdown OUT``: a run's figures by kind of request, and a session workload's moves.

A run's row (:mod:`bench.routing.report`) puts every request of its schedule in one distribution. Some workloads mix
kinds whose figures differ tenfold (long-short's 16,000-token prompts and its short chats: where 10% are long, TTFT
p90 falls on a long prompt's own prefill), and on multi-turn what sets TTFT p90 is how many later turns miss their
history. For every run under ``OUT/logs`` of a ``python -m bench.routing --out OUT``, this regenerates the run's
schedule from ``OUT/results.json`` (refusing one whose SHA-256 differs from the recorded one), joins it with the run's
``outcomes.jsonl`` and prints per workload and QPS: for each kind the workload labels (``Request.kind``), TTFT
p50/p90/p99, E2E p99 and hit rate over its successful requests, and how many were sent to a server while another
request of their kind sent there had no first token yet (by ``outcomes.jsonl``'s ``servers``), and the TTFT p90 of
the others (how much of the tail that prefill contention makes); per server, its requests, their TTFT p50 and how
many are above the run's TTFT p90 (on a pool with a slow server, whether its requests make the tail); on a workload
of sessions, the later turns served elsewhere than the session's previous turn and those that got less than half
their prompt from cache.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.routing.report import percentile
from bench.routing.runner import Outcome
from bench.routing.runs import OUTCOMES, load_outcomes, point_prefix, schedule_digest
from bench.routing.workloads import WORKLOADS, Request, generate

__all__ = ["KindRow", "ServerRow", "SessionCounts", "by_kind", "by_server", "main", "sessions"]


@dataclass(frozen=True)
class KindRow:
    """One kind's figures in one run (ms; hit rate as a fraction); ``behind``: requests sent to a server while
    another of their kind sent there had no first token yet; ``clear_ttft_p90_ms``: TTFT p90 of those whose server is
    known and that were not sent behind."""

    kind: str
    requests: int
    ttft_ms: tuple[float, float, float]
    e2e_p99_ms: float
    hit_rate: float
    behind: int = 0
    clear_ttft_p90_ms: float = math.nan


@dataclass(frozen=True)
class ServerRow:
    """The successful requests one server (or P/D pair, by ``outcomes.jsonl``'s ``servers``) served in a run: how many,
    their TTFT p50 (ms), and how many had a TTFT above the run's p90."""

    servers: tuple[int, ...]
    requests: int
    ttft_p50_ms: float
    above_p90: int


@dataclass(frozen=True)
class SessionCounts:
    """Later turns of a run's sessions: how many, served elsewhere than the turn before (where both are known), with
    less than half their prompt from cache, and both."""

    later: int
    moved: int
    mostly_missed: int
    moved_and_missed: int


def by_kind(requests: Sequence[Request], outcomes: Sequence[Outcome]) -> list[KindRow]:
    """Each kind's row, in the order kinds first appear in the schedule; successful requests only."""
    by_index = {r.index: r for r in requests}
    groups: dict[str, list[tuple[Request, Outcome]]] = {kind: [] for kind in dict.fromkeys(r.kind for r in requests)}
    for outcome in outcomes:
        request = by_index.get(outcome.index)
        if outcome.ok and request is not None:
            groups[request.kind].append((request, outcome))
    return [_row(kind, done) for kind, done in groups.items()]


def _row(kind: str, done: list[tuple[Request, Outcome]]) -> KindRow:
    ttft = [o.ttft * 1000 for _, o in done if o.ttft is not None]
    e2e = [o.e2e * 1000 for _, o in done if o.e2e is not None]
    prompt = sum(o.prompt_tokens for _, o in done)
    behind = _behind(done)
    clear = [o.ttft * 1000 for r, o in done if o.servers is not None and o.ttft is not None and r.index not in behind]
    return KindRow(kind, len(done), (percentile(ttft, 0.5), percentile(ttft, 0.9), percentile(ttft, 0.99)),
                   percentile(e2e, 0.99), sum(o.cached_tokens for _, o in done) / prompt if prompt else math.nan,
                   len(behind), percentile(clear, 0.9))


def _behind(done: list[tuple[Request, Outcome]]) -> set[int]:
    """The indices of requests sent (offset + the client's lag) while another of ``done`` on the same servers was
    before its first token; requests whose servers are unknown are never among them."""
    waiting: dict[tuple[int, ...], list[float]] = {}  # per servers: first-token times of those sent there, a heap
    behind: set[int] = set()
    for request, outcome in sorted(done, key=lambda d: d[0].offset + d[1].lag):
        if outcome.servers is None or outcome.ttft is None:
            continue
        sent = request.offset + outcome.lag
        ends = waiting.setdefault(tuple(outcome.servers), [])
        while ends and ends[0] <= sent:
            heapq.heappop(ends)
        if ends:
            behind.add(request.index)
        heapq.heappush(ends, sent + outcome.ttft)
    return behind


def by_server(outcomes: Sequence[Outcome]) -> list[ServerRow]:
    """A row per server (in index order) over the successful requests whose server and TTFT are known."""
    done = [o for o in outcomes if o.ok and o.ttft is not None and o.servers is not None]
    p90 = percentile([o.ttft for o in done if o.ttft is not None], 0.9)
    groups: dict[tuple[int, ...], list[float]] = {}
    for o in done:
        assert o.servers is not None and o.ttft is not None  # filtered above
        groups.setdefault(tuple(o.servers), []).append(o.ttft)
    return [ServerRow(servers, len(ttfts), percentile(ttfts, 0.5) * 1000, sum(t > p90 for t in ttfts))
            for servers, ttfts in sorted(groups.items())]


def sessions(requests: Sequence[Request], outcomes: Sequence[Outcome]) -> SessionCounts:
    """Count a session schedule's later turns (a group's requests after its first, in send order)."""
    got = {o.index: o for o in outcomes if o.ok}
    previous: dict[int, list[int] | None] = {}
    later = moved = missed = both = 0
    for request in sorted(requests, key=lambda r: r.offset):
        outcome = got.get(request.index)
        servers = outcome.servers if outcome is not None else None
        if request.group in previous and outcome is not None:
            before = previous[request.group]
            later += 1
            away = before is not None and servers is not None and servers != before
            short = outcome.cached_tokens < outcome.prompt_tokens / 2
            moved, missed, both = moved + away, missed + short, both + (away and short)
        previous[request.group] = servers
    return SessionCounts(later, moved, missed, both)


def _runs(out: Path, results: dict) -> Iterator[tuple[str, float, str, Path]]:
    """(workload, QPS, the run's name, its outcomes file) for every run under ``out/logs``."""
    prefixes = sorted(((point_prefix(s["workload"], float(s["qps"])), s["workload"], float(s["qps"]))
                       for s in results["schedules"]), key=lambda p: -len(p[0]))
    for log in sorted((out / "logs").glob(f"*/{OUTCOMES}")):
        name = log.parent.name
        point = next((p for p in prefixes if name.startswith(p[0])), None)
        if point is not None:
            yield point[1], point[2], name[len(point[0]):], log


def _schedule(results: dict, workload: str, qps: float) -> list[Request]:
    requests = generate(WORKLOADS[workload], qps, results["duration"], results["seed"], results["servers"])
    recorded = next(s["sha256"] for s in results["schedules"] if (s["workload"], s["qps"]) == (workload, qps))
    if schedule_digest(requests) != recorded:
        raise SystemExit(f"{workload} at {qps:g} QPS: this checkout generates another schedule than the run's "
                         "(its SHA-256 differs from results.json's); run the breakdown from the run's own checkout")
    return requests


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.1f}"


def report(out: Path) -> str:
    """The markdown tables for every run under ``out``."""
    results = json.loads((out / "results.json").read_text())
    lines: list[str] = []
    point: tuple[str, float] | None = None
    requests: list[Request] = []
    for workload, qps, run, log in _runs(out, results):
        if (workload, qps) != point:
            point, requests = (workload, qps), _schedule(results, workload, qps)
            lines += ["", f"**{workload}, {qps:g} QPS**", "",
                      "| run | kind | requests | TTFT p50 / p90 / p99 ms | E2E p99 ms | hit rate "
                      "| sent behind its kind | TTFT p90 of the rest ms |",
                      "|---|---|---:|---:|---:|---:|---:|---:|"]
        outcomes = load_outcomes(log)
        for row in by_kind(requests, outcomes):
            ttft = " / ".join(_ms(v) for v in row.ttft_ms)
            lines.append(f"| {run} | {row.kind or 'all'} | {row.requests} | {ttft} | {_ms(row.e2e_p99_ms)} | "
                         f"{100 * row.hit_rate:.1f}% | {row.behind} | {_ms(row.clear_ttft_p90_ms)} |")
        servers = " / ".join(f"{'+'.join(map(str, row.servers))}: {row.requests}, {_ms(row.ttft_p50_ms)}, "
                             f"{row.above_p90}" for row in by_server(outcomes))
        if servers:
            lines.append(f"| {run} | per server: requests, TTFT p50 ms, above the run's p90 | | {servers} | | | | |")
        if WORKLOADS[workload].sessions:
            c = sessions(requests, outcomes)
            lines.append(f"| {run} | later turns: moved / less than half cached / both | {c.later} | "
                         f"{c.moved} / {c.mostly_missed} / {c.moved_and_missed} | | | | |")
    return "\n".join(lines).lstrip("\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.routing.breakdown", description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="a `python -m bench.routing --out` directory")
    args = p.parse_args(argv)
    if not (args.out / "results.json").is_file():
        p.error(f"{args.out}/results.json not found: give a `python -m bench.routing --out` directory")
    print(report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
