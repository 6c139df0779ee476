"""What a run of one router on one workload at one QPS comes to, and the markdown tables of a whole benchmark.

:func:`summarize` turns the client's outcomes and the servers' counters into a :class:`Summary`: TTFT p50/p90/p99 and
E2E p99 of the successful requests (ms, linearly interpolated percentiles), output tokens per second (completion
tokens of successful requests over the time from the first send to the last answer), the prefix-cache hit rate
(cached / prompt tokens from the answers' usage; on a P/D pool EPP's gateway and vllm-router both answer with the
prefiller's cached tokens, not the decoder's count, which includes the KV it pulled),
the spread (requests per server, max / mean, within each P/D role, the worst role), preemptions and failures.
:func:`floor_summary` states the floors the same way (TTFT, E2E p99, and the output throughput no router can
exceed: ``bench/routing/floor.py``), :func:`median_summary` several runs of one router on one
schedule as their median. :func:`markdown` lays out one table per workload and QPS, and flags the rows whose requests
the load generator sent more than ``LAG_WARNING_MS`` late.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.routing.floor import FLOOR_ROW, Floor, throughput_ceiling
from bench.routing.pool import Counters
from bench.routing.runner import Outcome

__all__ = ["Summary", "floor_summary", "markdown", "median_summary", "percentile", "spread", "summarize"]


@dataclass
class Summary:
    """One row of a table: ``router`` on ``workload`` at ``qps``. ``note`` replaces the figures when it did not
    run (n/a and why, or the error that stopped it)."""

    workload: str
    qps: float
    router: str
    requests: int = 0
    failed: int = 0
    ttft_ms: tuple[float, float, float] = (math.nan, math.nan, math.nan)  # p50, p90, p99
    e2e_p99_ms: float = math.nan
    output_tok_s: float = math.nan
    hit_rate: float = math.nan
    spread: float = math.nan
    preemptions: int = 0
    kv_load_failures: int = 0
    max_lag_ms: float = 0.0
    wall_s: float = 0.0  # the whole run: pool and router start, the schedule, the last answers, the stops
    median_of: int = 1  # more than 1: each figure is the median over that many runs (see median_summary)
    note: str = ""
    errors: list[str] = field(default_factory=list)  # the first few distinct failures

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Summary:
        """A row of ``results.json`` (``to_json`` with NaN written as null) back as a Summary; unknown keys of an
        older or newer file are ignored."""
        def num(value: Any) -> float:
            return math.nan if value is None else float(value)

        known = {k: v for k, v in row.items() if k in cls.__dataclass_fields__}
        known["ttft_ms"] = tuple(num(v) for v in row["ttft_ms"])
        for figure in ("e2e_p99_ms", "output_tok_s", "hit_rate", "spread"):
            known[figure] = num(row.get(figure))
        return cls(**known)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, linearly interpolated between order statistics (numpy's default);
    NaN for no values."""
    if not values:
        return math.nan
    data = sorted(values)
    pos = q * (len(data) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def spread(counts: Sequence[int], roles: Sequence[str]) -> float:
    """Requests per server, max / mean, computed within each role; the largest over the roles (NaN: no requests)."""
    ratios = []
    for role in set(roles):
        group = [c for c, r in zip(counts, roles) if r == role]
        if sum(group):
            ratios.append(max(group) * len(group) / sum(group))
    return max(ratios, default=math.nan)


def summarize(workload: str, qps: float, router: str, outcomes: Sequence[Outcome], counters: Sequence[Counters],
              roles: Sequence[str]) -> Summary:
    """The row for one run (see the module docstring)."""
    ok = [o for o in outcomes if o.ok]
    ttfts = [o.ttft * 1e3 for o in ok if o.ttft is not None]
    e2es = [o.e2e * 1e3 for o in ok if o.e2e is not None]
    prompt = sum(o.prompt_tokens for o in ok)
    elapsed = max((o.end for o in outcomes), default=0.0)
    errors = sorted({f"{o.status}: {o.error}" for o in outcomes if not o.ok})
    return Summary(
        workload, qps, router, requests=len(outcomes), failed=len(outcomes) - len(ok),
        ttft_ms=(percentile(ttfts, 0.5), percentile(ttfts, 0.9), percentile(ttfts, 0.99)),
        e2e_p99_ms=percentile(e2es, 0.99),
        output_tok_s=sum(o.completion_tokens for o in ok) / elapsed if elapsed > 0 else math.nan,
        hit_rate=sum(o.cached_tokens for o in ok) / prompt if prompt else math.nan,
        spread=spread([c.finished for c in counters], roles),
        preemptions=sum(c.preemptions for c in counters),
        kv_load_failures=sum(c.kv_load_failures for c in counters),
        max_lag_ms=max((o.lag for o in outcomes), default=0.0) * 1e3,
        errors=errors[:5])


def floor_summary(workload: str, qps: float, floors: Sequence[Floor]) -> Summary:
    """A schedule's floors as a row: TTFT and E2E floors' percentiles, and the throughput ceiling."""
    ms = [f.ttft * 1e3 for f in floors]
    return Summary(workload, qps, FLOOR_ROW, requests=len(ms),
                   ttft_ms=(percentile(ms, 0.5), percentile(ms, 0.9), percentile(ms, 0.99)),
                   e2e_p99_ms=percentile([f.e2e * 1e3 for f in floors], 0.99),
                   output_tok_s=throughput_ceiling(floors))


def median_summary(runs: Sequence[Summary]) -> Summary:
    """Several runs of one router on one schedule as one row: the median of each figure over the runs that completed
    (a run that gives a figure no value, NaN, is left out of that figure), the most failures and the latest send of
    any run, their wall time added up. No completed run: the first run's row (its note says why)."""
    done = [r for r in runs if not r.note]
    if not done:
        return runs[0]

    def median(figure: Callable[[Summary], float]) -> float:
        values = [v for v in map(figure, done) if not math.isnan(v)]
        return statistics.median(values) if values else math.nan

    first = done[0]
    return Summary(
        first.workload, first.qps, first.router, requests=first.requests, failed=max(r.failed for r in done),
        ttft_ms=(median(lambda r: r.ttft_ms[0]), median(lambda r: r.ttft_ms[1]), median(lambda r: r.ttft_ms[2])),
        e2e_p99_ms=median(lambda r: r.e2e_p99_ms), output_tok_s=median(lambda r: r.output_tok_s),
        hit_rate=median(lambda r: r.hit_rate), spread=median(lambda r: r.spread),
        preemptions=round(median(lambda r: r.preemptions)), kv_load_failures=round(median(lambda r: r.kv_load_failures)),
        max_lag_ms=max(r.max_lag_ms for r in done), wall_s=sum(r.wall_s for r in runs), median_of=len(done),
        errors=sorted({e for r in done for e in r.errors})[:5])


LAG_WARNING_MS = 10.0
"""A request sent this much later than its offset is flagged under the table."""

_HEADER = ("router", "TTFT p50 / p90 / p99 ms", "E2E p99 ms", "output tok/s", "hit rate", "spread (max/mean)",
           "preemptions", "failed")


def _num(value: float, digits: int = 1) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}" if abs(value) < 100 else f"{value:,.0f}"


def _row(s: Summary) -> list[str]:
    if s.note:
        return [s.router, s.note] + [""] * (len(_HEADER) - 2)
    if s.router == FLOOR_ROW:
        return [s.router, " / ".join(_num(v) for v in s.ttft_ms), _num(s.e2e_p99_ms), _num(s.output_tok_s, 0)] \
            + [""] * (len(_HEADER) - 4)
    return [s.router, " / ".join(_num(v) for v in s.ttft_ms), _num(s.e2e_p99_ms), _num(s.output_tok_s, 0),
            "-" if math.isnan(s.hit_rate) else f"{s.hit_rate:.1%}", _num(s.spread, 2), str(s.preemptions),
            f"{s.failed} / {s.requests}"]


def markdown(summaries: Sequence[Summary]) -> str:
    """One table per (workload, QPS), rows in the order given."""
    out: list[str] = []
    keys: list[tuple[str, float]] = []
    for s in summaries:
        if (s.workload, s.qps) not in keys:
            keys.append((s.workload, s.qps))
    for workload, qps in keys:
        group = [s for s in summaries if (s.workload, s.qps) == (workload, qps)]
        header, rows = list(_HEADER), [_row(s) for s in group]
        if any(s.kv_load_failures for s in group):  # P/D only: decodes that recomputed instead of pulling KV
            header.append("KV load failures")
            rows = [row + ["" if s.note or s.router == FLOOR_ROW else str(s.kv_load_failures)]
                    for row, s in zip(rows, group)]
        out += [f"**{workload}, {qps:g} QPS**", "", "| " + " | ".join(header) + " |",
                "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
        out += ["| " + " | ".join(row) + " |" for row in rows]
        repeated = sorted({s.median_of for s in group if s.median_of > 1})
        if repeated:  # the reader must know these are medians, and of how many runs
            out += ["", f"Medians of {' or '.join(map(str, repeated))} runs per router."]
        late = [s for s in group if s.max_lag_ms > LAG_WARNING_MS]
        if late:  # the client sent late: its own CPU, not the router, shaped those arrivals
            out += ["", "The load generator sent requests late (max): " + ", ".join(
                f"{s.router} {s.max_lag_ms:.0f} ms" for s in late) + "."]
        out.append("")
    return "\n".join(out)
