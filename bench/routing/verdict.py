"""How one EPP profile compares with the best peer in finished runs: ``python -m bench.routing.verdict RESULTS...``.

Per workload, at its highest QPS in ``results.json`` (the sweeps end near saturation), it divides the profile's
figures by the best peer's: TTFT p90 (best = lowest), E2E p99 (lowest) and output tok/s (highest). A P/D workload
is judged with the P/D profile. The targets are the routing issue's: TTFT p90 at most 0.7x the best peer's in at
least three of the hard workloads and never above 1.1x, throughput at least the best peer's, E2E p99 not above it.
Peers are the routers named ``vllm:*`` or ``sglang:*`` that ran; a workload no peer ran is listed without ratios.
Beside them, the profile's and that best peer's throughput over the schedule's ceiling (the floor row's tok/s,
``bench/routing/floor.py``): how much room any router had left. Given several ``results.json`` that measured one
router at one point (say a run, then a ``--repeat 2`` run of the same schedule), :func:`pooled` judges the median of
every run behind their rows, as ``--repeat`` does within one.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.routing.floor import FLOOR_ROW
from bench.routing.report import Summary, median_summary

__all__ = ["HARD", "RECOMMENDED", "RECOMMENDED_PD", "Verdict", "is_peer", "judge", "markdown", "pooled"]

RECOMMENDED, RECOMMENDED_PD = "epp:cost-model", "epp:pd-cost-model"
HARD = ("cache-pressure", "hot-prefix", "heterogeneous", "long-short")
TTFT_WIN, TTFT_LIMIT = 0.7, 1.1


@dataclass
class Verdict:
    """One workload: the QPS judged, the profile and best peers, and the three ratios (NaN: not measured)."""

    workload: str
    qps: float
    ours: str
    peer_ttft: str = ""
    peer_e2e: str = ""
    peer_tput: str = ""
    ttft_ratio: float = math.nan
    e2e_ratio: float = math.nan
    tput_ratio: float = math.nan
    ours_of_ceiling: float = math.nan
    peer_of_ceiling: float = math.nan

    @property
    def ok(self) -> bool:
        """Within the never-worse targets (TTFT ≤ 1.1x, E2E ≤ 1x, throughput ≥ 1x)."""
        return self.ttft_ratio <= TTFT_LIMIT and self.e2e_ratio <= 1.0 and self.tput_ratio >= 1.0


def is_peer(router: str) -> bool:
    """A peer router's name (``vllm:*``, ``sglang:*``)."""
    return router.split(":", 1)[0] in ("vllm", "sglang")


def _ran(row: dict[str, Any]) -> bool:
    return not row.get("note") and row.get("ttft_ms") is not None and row["ttft_ms"][1] is not None


def judge(runs: list[dict[str, Any]], ours: str, pd_ours: str, pd_workloads: set[str]) -> list[Verdict]:
    """The verdict per workload, in the order the workloads first appear in ``runs``."""
    out = []
    for workload in dict.fromkeys(r["workload"] for r in runs):
        qps = max(r["qps"] for r in runs if r["workload"] == workload)
        rows = [r for r in runs if r["workload"] == workload and r["qps"] == qps and _ran(r)]
        name = pd_ours if workload in pd_workloads else ours
        mine = next((r for r in rows if r["router"] == name), None)
        peers = [r for r in rows if is_peer(r["router"])]
        verdict = Verdict(workload, qps, name)
        if mine is not None and peers:
            best_ttft = min(peers, key=lambda r: r["ttft_ms"][1])
            best_e2e = min(peers, key=lambda r: r["e2e_p99_ms"])
            best_tput = max(peers, key=lambda r: r["output_tok_s"])
            verdict.peer_ttft, verdict.peer_e2e, verdict.peer_tput = (
                best_ttft["router"], best_e2e["router"], best_tput["router"])
            verdict.ttft_ratio = mine["ttft_ms"][1] / best_ttft["ttft_ms"][1]
            verdict.e2e_ratio = mine["e2e_p99_ms"] / best_e2e["e2e_p99_ms"]
            verdict.tput_ratio = mine["output_tok_s"] / best_tput["output_tok_s"]
            ceiling = next((r["output_tok_s"] for r in rows if r["router"] == FLOOR_ROW), None)
            if isinstance(ceiling, (int, float)) and ceiling > 0:  # NaN or absent in results of older runs
                verdict.ours_of_ceiling = mine["output_tok_s"] / ceiling
                verdict.peer_of_ceiling = best_tput["output_tok_s"] / ceiling
        out.append(verdict)
    return out


def pooled(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of several ``results.json`` as one list: a (workload, QPS, router) measured in more than one of them
    gets the median of each figure over every run behind its rows (a file's ``repeated_runs`` where it has them,
    else its row); a floor row, and a router that never ran there (its note), are taken from the first file."""
    runs: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for data in results:
        repeated: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
        for run in data.get("repeated_runs") or []:
            repeated.setdefault(_key(run), []).append(run)
        for row in data["runs"]:
            runs.setdefault(_key(row), []).extend(repeated.get(_key(row)) or [row])
    out = []
    for rows in runs.values():
        done = [r for r in rows if _ran(r)]
        if len(done) < 2 or rows[0]["router"] == FLOOR_ROW:
            out.append(done[0] if done else rows[0])
        else:
            out.append(median_summary([Summary.from_json(r) for r in done]).to_json())
    return out


def _key(row: dict[str, Any]) -> tuple[str, float, str]:
    return row["workload"], float(row["qps"]), row["router"]


def _ratio(value: float, peer: str, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f} ({peer})"


def _share(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2%}"


def markdown(verdicts: list[Verdict]) -> str:
    """A table of the ratios and a closing line on the targets."""
    lines = ["| workload | QPS | profile | TTFT p90 / best peer | E2E p99 / best peer | output tok/s / best peer |"
             " within 1.1x / 1x / 1x | tok/s / ceiling: profile, best peer |", "|---|---:|---|---:|---:|---:|---|---|"]
    for v in verdicts:
        outcome = ('yes' if v.ok else 'no') if not math.isnan(v.ttft_ratio) else 'no peer ran'
        lines.append(f"| {v.workload} | {v.qps:g} | {v.ours} | {_ratio(v.ttft_ratio, v.peer_ttft)} | "
                     f"{_ratio(v.e2e_ratio, v.peer_e2e)} | {_ratio(v.tput_ratio, v.peer_tput, 3)} | {outcome} | "
                     f"{_share(v.ours_of_ceiling)}, {_share(v.peer_of_ceiling)} |")
    wins = [v.workload for v in verdicts if v.workload in HARD and v.ttft_ratio <= TTFT_WIN]
    judged = [v for v in verdicts if not math.isnan(v.ttft_ratio)]
    lines += ["", f"TTFT p90 at most {TTFT_WIN}x the best peer's in {len(wins)} of the hard workloads "
              f"({', '.join(wins) or 'none'}; the target is 3); within every never-worse target in "
              f"{sum(v.ok for v in judged)} of {len(judged)} workloads."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.routing.verdict", description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, nargs="+",
                   help="results.json of python -m bench.routing (several: their runs together, a point measured "
                        "in several as the median of all its runs)")
    p.add_argument("--ours", default=RECOMMENDED, help=f"the profile judged (default {RECOMMENDED})")
    p.add_argument("--pd-ours", default=RECOMMENDED_PD, help="the profile judged on P/D workloads")
    args = p.parse_args(argv)
    from bench.routing.workloads import WORKLOADS

    runs = pooled([json.loads(path.read_text()) for path in args.results])
    print(markdown(judge(runs, args.ours, args.pd_ours, {w.name for w in WORKLOADS.values() if w.pd})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
