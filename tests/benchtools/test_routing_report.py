"""``bench.routing.report``: percentiles, spread, the row of a run and the tables, on hand-computed cases."""

from __future__ import annotations

import json
import math

import pytest

from bench.routing.floor import Floor
from bench.routing.pool import Counters
from bench.routing.report import Summary, floor_summary, markdown, median_summary, percentile, spread, summarize
from bench.routing.runner import Outcome
from bench.routing.runs import strict


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
    ([1.0, 2.0, 3.0, 4.0], 0.9, 3.7),
    ([4.0, 1.0, 3.0, 2.0], 0.0, 1.0),
    ([4.0, 1.0, 3.0, 2.0], 1.0, 4.0),
    ([5.0], 0.99, 5.0),
])
def test_percentile_interpolates_linearly(values: list[float], q: float, expected: float) -> None:
    assert math.isclose(percentile(values, q), expected)


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(percentile([], 0.5))


def test_spread_is_max_over_mean_within_each_role_and_the_worst_role_wins() -> None:
    assert spread([10, 20, 30, 40], ["both"] * 4) == 1.6
    assert spread([5, 15, 10, 10], ["prefill", "prefill", "decode", "decode"]) == 1.5
    assert math.isnan(spread([0, 0], ["both", "both"]))


def _ok(index: int, ttft: float, e2e: float, end: float, prompt: int = 100, cached: int = 0,
        completion: int = 10) -> Outcome:
    return Outcome(index, 200, ttft, e2e, prompt, cached, completion, lag=0.001 * index, end=end)


def test_a_run_summarizes_successful_requests_and_counts_the_rest() -> None:
    outcomes = [_ok(0, 0.010, 0.5, 1.0, cached=50), _ok(1, 0.020, 0.6, 2.0), _ok(2, 0.030, 0.7, 4.0, cached=100),
                Outcome(3, 503, error="overloaded", end=0.5), Outcome(4, 200, 0.01, error="cut short", end=3.0)]
    counters = [Counters(finished=3, preemptions=1), Counters(finished=1, preemptions=2, kv_load_failures=1)]
    row = summarize("w", 10.0, "r", outcomes, counters, ["both", "both"])
    assert (row.requests, row.failed) == (5, 2)
    assert row.ttft_ms == pytest.approx((20.0, 28.0, 29.8))
    assert row.e2e_p99_ms == pytest.approx(698.0)
    assert row.output_tok_s == pytest.approx(30 / 4.0)  # completion tokens of the 3 good ones over the last end
    assert row.hit_rate == pytest.approx(150 / 300)
    assert row.spread == pytest.approx(1.5)
    assert (row.preemptions, row.kv_load_failures) == (3, 1)
    assert row.max_lag_ms == pytest.approx(2.0)  # the failed ones left on time
    assert row.errors == ["200: cut short", "503: overloaded"]


def test_tables_have_one_per_workload_and_qps_with_notes_and_the_floor() -> None:
    rows = [floor_summary("w", 5.0, [Floor(0.0, 0.010, 1.0, 100), Floor(0.5, 0.020, 2.0, 300)]),
            summarize("w", 5.0, "rr", [_ok(0, 0.015, 0.5, 1.0)], [Counters(finished=1)], ["both"]),
            Summary("w", 5.0, "envoy:default", note="n/a: because"),
            summarize("w", 9.0, "rr", [_ok(0, 0.015, 0.5, 1.0)], [Counters(finished=1, kv_load_failures=2)],
                      ["both"])]
    text = markdown(rows)
    assert text.index("**w, 5 QPS**") < text.index("**w, 9 QPS**")
    first, second = text.split("**w, 9 QPS**")
    # E2E floors' p99 between 1 and 2 s; the ceiling 400 tokens over the second answer's end at 2.5 s
    assert "| floor (cached prefix, no queue) | 15.0 / 19.0 / 19.9 | 1,990 | 160 |  |  |  |  |" in first
    assert "| rr | 15.0 / 15.0 / 15.0 | 500 | 10 | 0.0% | 1.00 | 0 | 0 / 1 |" in first
    assert "| envoy:default | n/a: because |" in first
    assert "KV load failures" not in first and "KV load failures" in second and "| 0 / 1 | 2 |" in second


def test_a_table_flags_rows_whose_requests_left_late() -> None:
    late, punctual = Summary("w", 1.0, "late", max_lag_ms=25.0), Summary("w", 1.0, "punctual", max_lag_ms=2.0)
    assert "The load generator sent requests late (max): late 25 ms." in markdown([late, punctual])
    assert "late (max)" not in markdown([punctual])


def test_repeated_runs_are_one_row_of_medians_without_the_runs_that_did_not_complete() -> None:
    runs = [Summary("w", 5.0, "r", requests=10, failed=f, ttft_ms=(t, t * 2, t * 3), e2e_p99_ms=e, output_tok_s=o,
                    hit_rate=h, spread=1.0, preemptions=p, max_lag_ms=lag, wall_s=40.0, errors=errs)
            for f, t, e, o, h, p, lag, errs in [(0, 10.0, 700.0, 100.0, 0.5, 1, 2.0, []),
                                                (2, 30.0, 900.0, 90.0, math.nan, 4, 12.0, ["503: busy"]),
                                                (0, 20.0, 800.0, 95.0, 0.7, 2, 1.0, [])]]
    runs.append(Summary("w", 5.0, "r", wall_s=3.0, note="error: it did not start"))
    row = median_summary(runs)
    assert (row.router, row.requests, row.median_of, row.note) == ("r", 10, 3, "")
    assert row.ttft_ms == (20.0, 40.0, 60.0) and row.e2e_p99_ms == 800.0 and row.output_tok_s == 95.0
    assert row.hit_rate == pytest.approx(0.6)          # the run without a hit rate is left out of that figure
    assert (row.failed, row.preemptions, row.max_lag_ms) == (2, 2, 12.0)   # the worst run's failures and lag
    assert row.wall_s == 123.0 and row.errors == ["503: busy"]
    assert "Medians of 3 runs per router." in markdown([row])
    assert "Medians" not in markdown([runs[0]])
    assert median_summary(runs[3:]) is runs[3]         # none completed: the row says why


def test_a_results_row_reads_back_as_the_summary_it_was_written_from() -> None:
    row = Summary("hot-prefix", 30.0, "epp:cost-model", requests=10, failed=1, ttft_ms=(20.0, 49.0, 99.0),
                  e2e_p99_ms=1500.0, output_tok_s=4395.7, hit_rate=math.nan, spread=1.06, preemptions=2,
                  median_of=3, note="", errors=["503"])
    back = Summary.from_json(json.loads(json.dumps(strict(row.to_json()))) | {"from_a_newer_file": 1})
    assert math.isnan(back.hit_rate)
    assert back.to_json() | {"hit_rate": 0} == row.to_json() | {"hit_rate": 0}
