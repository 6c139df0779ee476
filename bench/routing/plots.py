"""PNG plots of a routing benchmark's results: per workload, TTFT p90 against QPS and output throughput against QPS,
one line per router (the TTFT floor and the throughput ceiling dashed).

Only the standard library and matplotlib are imported, so the benchmark can run this file with another venv's Python
when matplotlib is not installed next to EPP: ``python bench/routing/plots.py results.json OUTDIR`` prints the files
it wrote, one per line.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

__all__ = ["plot"]

FLOOR_PREFIX = "floor"


def _series(runs: list[dict[str, Any]], workload: str, value: str) -> dict[str, list[tuple[float, float]]]:
    """router -> [(qps, value)], QPS ascending, for the runs of ``workload`` that produced figures."""
    out: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        if run["workload"] != workload or run.get("note"):
            continue
        y = run["ttft_ms"][1] if value == "ttft_p90" else run["output_tok_s"]
        if y is None or (isinstance(y, float) and math.isnan(y)):
            continue
        out.setdefault(run["router"], []).append((run["qps"], y))
    return {router: sorted(points) for router, points in out.items()}


def plot(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    """Write the two plots of every workload in ``runs`` (Summary dicts) under ``out``; the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for workload in dict.fromkeys(run["workload"] for run in runs):
        for value, ylabel, suffix in (("ttft_p90", "TTFT p90 (ms)", "ttft-p90"),
                                      ("throughput", "output tokens/s", "throughput")):
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for router, points in _series(runs, workload, value).items():
                floor = router.startswith(FLOOR_PREFIX)
                label = "ceiling (every answer alone)" if floor and value == "throughput" else router
                ax.plot([p[0] for p in points], [p[1] for p in points], "--x" if floor else "-o", label=label)
            ax.set_title(f"{workload}: {ylabel} vs QPS")
            ax.set_xlabel("QPS (open loop)")
            ax.set_ylabel(ylabel)
            if value == "ttft_p90":
                ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            path = out / f"{workload}-{suffix}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


def main(argv: list[str]) -> int:
    results, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for path in plot(json.loads(results.read_text())["runs"], out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
