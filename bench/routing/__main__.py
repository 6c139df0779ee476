"""``python -m bench.routing``: the side-by-side routing benchmark (docs/routing.md).

For every workload and QPS, one seeded schedule is generated; then each router in turn gets a fresh simulated pool
(cold caches, zeroed counters), is started over it, is sent the schedule open loop, and is stopped; ``--repeat N``
does that N times, round by round over the routers, and reports each figure's median. Each (workload, QPS) prints a
table to stdout as soon as its routers are done; ``--out DIR`` receives ``results.json`` (every row, and with
``--repeat`` every run behind it; written after each run), ``report.md`` (the tables), ``verdict.md`` (when peers ran:
EPP's recommended profile against the best peer, :mod:`bench.routing.verdict`), the plots (``--plots``) and ``logs/``
(every child's output).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.routing import venvs, verdict
from bench.routing.report import Summary
from bench.routing.routers import DEFAULT_ROUTERS, NEEDS_TOKENIZER, PEER_ROUTERS, make_router
from bench.routing.runs import DURATION, QUICK_DURATION, Bench, Settings, event_loop_runner, strict
from bench.routing.workloads import WORKLOADS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}")
    p.add_argument("--qps", help="comma list of QPS for every workload (default: each workload's own sweep)")
    p.add_argument("--duration", type=float,
                   help=f"seconds of arrivals per run (default {DURATION:g}; {QUICK_DURATION:g} with --quick)")
    p.add_argument("--routers", default=",".join(DEFAULT_ROUTERS),
                   help="comma list: rr, epp:PROFILE, envoy:PROFILE, vllm:POLICY, sglang:POLICY")
    p.add_argument("--peers", action="store_true",
                   help=f"add {', '.join(PEER_ROUTERS)}, installing their venvs if missing")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each router per workload and QPS; the tables show each figure's median (default 1)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--servers", type=int, default=4, help="simulated servers (default 4)")
    p.add_argument("--tokenizer", type=Path, metavar="DIR",
                   help="the servers tokenize with DIR's tokenizer.json (build it with python -m "
                        "bench.routing.tokenizer DIR); epp:precise-local and epp:cost-model-precise read it too")
    p.add_argument("--out", type=Path, help="results directory (default routing-results/<time>)")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_DURATION:g} s per run and only the lowest QPS of each sweep (a smoke run)")
    p.add_argument("--plots", choices=("auto", "install", "off"), default="auto",
                   help="auto: plot if matplotlib is importable here or in the plots venv; install: create that "
                        "venv if needed")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, not {args.repeat}")
    if args.list:
        for w in WORKLOADS.values():
            print(f"{w.name:15} {w.summary}\n{'':15} default QPS for {args.servers} servers: "
                  f"{', '.join(f'{q:g}' for q in w.qps(args.servers))}")
        return 0
    try:
        workloads = [WORKLOADS[name] for name in args.workloads.split(",")]
    except KeyError as exc:
        print(f"unknown workload {exc}; --list shows them", file=sys.stderr)
        return 2
    try:
        qps = tuple(float(q) for q in args.qps.split(",")) if args.qps else None
    except ValueError:
        parser.error(f"--qps takes a comma list of numbers, not {args.qps!r}")
    if qps is not None and min(qps) <= 0:
        parser.error(f"--qps must be positive, not {args.qps!r}")
    settings = Settings(duration=args.duration or (QUICK_DURATION if args.quick else DURATION), repeat=args.repeat,
                        servers=args.servers, seed=args.seed, qps=qps, quick=args.quick, tokenizer=args.tokenizer)
    if args.tokenizer is not None and not (args.tokenizer / "tokenizer.json").is_file():
        parser.error(f"--tokenizer: no tokenizer.json in {args.tokenizer} (python -m bench.routing.tokenizer DIR "
                     f"builds one)")
    names = args.routers.split(",") + (list(PEER_ROUTERS) if args.peers else [])
    local = [name for name in names if name.partition(":")[2] in NEEDS_TOKENIZER]
    if args.tokenizer is None and local:
        parser.error(f"{local[0]} needs --tokenizer DIR (a pool whose servers tokenize as EPP does)")
    out: Path = args.out or Path("routing-results") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    try:
        routers = [make_router(name, install=args.peers) for name in dict.fromkeys(names)]
    except (ValueError, venvs.MissingTool) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bench = Bench(settings, out, routers)
    try:
        event_loop_runner()(bench.run(workloads))
    except KeyboardInterrupt:
        print("\ninterrupted; partial results in " + str(out), file=sys.stderr)
        return 130
    _verdict(out, bench.rows)
    _plots(out, args.plots)
    return 0


def _verdict(out: Path, rows: list[Summary]) -> None:
    """With peers in the run: print EPP's recommended profiles against the best peer and keep it as verdict.md."""
    runs = [strict(r.to_json()) for r in rows]
    if not any(verdict.is_peer(r["router"]) and not r["note"] for r in runs):
        return
    text = verdict.markdown(verdict.judge(runs, verdict.RECOMMENDED, verdict.RECOMMENDED_PD,
                                          {w.name for w in WORKLOADS.values() if w.pd}))
    (out / "verdict.md").write_text(text + "\n")
    print(text)


def _plots(out: Path, mode: str) -> None:
    """Draw the plots here if matplotlib is importable, else with the plots venv's Python, else say how."""
    if mode == "off":
        return
    results, script = out / "results.json", Path(__file__).with_name("plots.py")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        tool = venvs.TOOLS["plots"]
        if not venvs.ready(tool) and mode != "install":
            print(f"plots skipped: matplotlib is not installed (pip install matplotlib, or rerun with --plots "
                  f"install to put it in {venvs.venv_dir(tool)})", file=sys.stderr)
            return
        python = venvs.ensure(tool, install=True, log=out / "logs" / "plots-venv.log") / "bin" / "python"
        subprocess.run([str(python), str(script), str(results), str(out)], check=True)
        return
    from bench.routing.plots import plot

    for path in plot(json.loads(results.read_text())["runs"], out):
        print(path)


if __name__ == "__main__":
    sys.exit(main())
