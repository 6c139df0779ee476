"""``bench.routing.verdict``: the ratios against the best peer at each workload's highest QPS, on hand-made rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.routing.verdict import judge, main, markdown, pooled


def row(workload: str, qps: float, router: str, p90: float, e2e: float, tput: float, note: str = "") -> dict:
    return {"workload": workload, "qps": qps, "router": router, "ttft_ms": [p90 / 2, p90, p90 * 2],
            "e2e_p99_ms": e2e, "output_tok_s": tput, "note": note}


RUNS = [
    {"workload": "hot-prefix", "qps": 30, "router": "floor (cached prefix, no queue)", "ttft_ms": [1, 2, 3],
     "e2e_p99_ms": None, "output_tok_s": None, "note": ""},
    row("hot-prefix", 20, "epp:cost-model", 100, 1000, 100),       # a lower QPS: not judged
    row("hot-prefix", 20, "vllm:power_of_two", 10, 100, 1000),
    row("hot-prefix", 30, "epp:cost-model", 40, 1600, 4461),
    row("hot-prefix", 30, "epp:default", 10, 100, 9999),            # not a peer, not the profile judged
    row("hot-prefix", 30, "sglang:cache_aware", 895, 4378, 4362),
    row("hot-prefix", 30, "vllm:power_of_two", 123, 1779, 4463),
    row("hot-prefix", 30, "vllm:cache_aware", 0, 0, 0, note="error: did not start"),
    row("pd", 10, "floor (cached prefix, no queue)", 20, 500, 400),  # its tok/s: the schedule's ceiling
    row("pd", 10, "epp:cost-model", 0, 0, 0, note="n/a: not a P/D profile"),
    row("pd", 10, "epp:pd-cost-model", 150, 800, 340),
    row("pd", 10, "vllm:cache_aware", 140, 750, 340),
    row("random", 28, "epp:cost-model", 38, 6000, 5000),
]


def test_ratios_are_taken_at_the_highest_qps_against_each_figures_best_peer_that_ran() -> None:
    hot, pd, rand = judge(RUNS, "epp:cost-model", "epp:pd-cost-model", {"pd"})
    assert (hot.qps, hot.ours, hot.peer_ttft, hot.peer_e2e, hot.peer_tput) == (
        30, "epp:cost-model", "vllm:power_of_two", "vllm:power_of_two", "vllm:power_of_two")
    assert hot.ttft_ratio == pytest.approx(40 / 123) and hot.e2e_ratio == pytest.approx(1600 / 1779)
    assert hot.tput_ratio == pytest.approx(4461 / 4463) and not hot.ok      # 0.05% less throughput is "no"
    assert pd.ours == "epp:pd-cost-model" and pd.ttft_ratio == pytest.approx(150 / 140)
    assert math.isnan(rand.ttft_ratio) and rand.peer_ttft == ""              # no peer ran
    assert (pd.ours_of_ceiling, pd.peer_of_ceiling) == (340 / 400, 340 / 400)
    assert math.isnan(hot.ours_of_ceiling)                                   # a floor row without a ceiling


def test_the_table_counts_hard_wins_and_marks_unjudged_workloads(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    text = markdown(judge(RUNS, "epp:cost-model", "epp:pd-cost-model", {"pd"}))
    assert "| hot-prefix | 30 | epp:cost-model | 0.33 (vllm:power_of_two) |" in text
    assert "| random | 28 | epp:cost-model | - | - | - | no peer ran |" in text
    assert "in 1 of the hard workloads (hot-prefix; the target is 3)" in text
    assert "| 1.000 (vllm:cache_aware) | no | 85.00%, 85.00% |" in text and "| no | -, - |" in text
    assert "within every never-worse target in 0 of 2 workloads" in text
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": RUNS}))
    assert main([str(results)]) == 0
    assert capsys.readouterr().out == text + "\n"      # the CLI takes the P/D workloads from the workload list
    first, second = tmp_path / "a.json", tmp_path / "b.json"  # runs of one benchmark split over two result files
    first.write_text(json.dumps({"runs": RUNS[:6]}))
    second.write_text(json.dumps({"runs": RUNS[6:]}))
    assert main([str(first), str(second)]) == 0
    assert capsys.readouterr().out == text + "\n"


def test_a_point_measured_in_several_results_is_judged_on_the_median_of_all_its_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = {"runs": [RUNS[0], row("hot-prefix", 30, "epp:cost-model", 40, 1600, 4461),
                      row("hot-prefix", 30, "sglang:cache_aware", 60, 1500, 4460)]}
    # A --repeat 2 run of the same point: its rows are medians, its repeated_runs what is pooled.
    again = {"runs": [RUNS[0], row("hot-prefix", 30, "epp:cost-model", 0, 0, 0),
                      row("hot-prefix", 30, "sglang:cache_aware", 0, 0, 0),
                      row("hot-prefix", 30, "vllm:power_of_two", 0, 0, 0, note="error: did not start")],
             "repeated_runs": [row("hot-prefix", 30, "epp:cost-model", 50, 1700, 4459),
                               row("hot-prefix", 30, "sglang:cache_aware", 55, 1400, 4462),
                               row("hot-prefix", 30, "epp:cost-model", 46, 1650, 4463),
                               row("hot-prefix", 30, "sglang:cache_aware", 90, 1450, 4458)]}
    rows = {r["router"]: r for r in pooled([first, again])}
    assert rows["epp:cost-model"]["ttft_ms"][1] == 46 and rows["epp:cost-model"]["median_of"] == 3
    assert rows["sglang:cache_aware"]["e2e_p99_ms"] == 1450 and rows["sglang:cache_aware"]["output_tok_s"] == 4460
    assert rows["vllm:power_of_two"]["note"] == "error: did not start"      # never ran: kept, and not judged
    assert rows[RUNS[0]["router"]] == RUNS[0]
    (hot,) = judge(list(rows.values()), "epp:cost-model", "epp:pd-cost-model", set())
    assert hot.ttft_ratio == pytest.approx(46 / 60) and hot.e2e_ratio == pytest.approx(1650 / 1450)
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, data in zip(paths, (first, again)):
        path.write_text(json.dumps(data))
    assert main([str(p) for p in paths]) == 0
    assert "| hot-prefix | 30 | epp:cost-model | 0.77 (sglang:cache_aware) | 1.14 (sglang:cache_aware) |" \
        in capsys.readouterr().out
