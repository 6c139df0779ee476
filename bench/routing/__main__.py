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
import asyncio
import dataclasses
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.routing import venvs, verdict
from bench.routing.floor import request_floors
from bench.routing.pool import SimFleet
from bench.routing.report import Summary, floor_summary, markdown, median_summary, summarize
from bench.routing.routers import DEFAULT_ROUTERS, PEER_ROUTERS, Router, make_router
from bench.routing.runner import Progress, replay
from bench.routing.workloads import WORKLOADS, Request, Workload, generate

DURATION = 60.0
QUICK_DURATION = 10.0


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
    out: Path = args.out or Path("routing-results") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    names = args.routers.split(",") + (list(PEER_ROUTERS) if args.peers else [])
    try:
        routers = [make_router(name, install=args.peers) for name in dict.fromkeys(names)]
    except (ValueError, venvs.MissingTool) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bench = Bench(args, out, routers)
    try:
        event_loop_runner()(bench.run(workloads))
    except KeyboardInterrupt:
        print("\ninterrupted; partial results in " + str(out), file=sys.stderr)
        return 130
    _verdict(out, bench.rows)
    _plots(out, args.plots)
    return 0


class Bench:
    """Runs every (workload, QPS, router) and records the rows."""

    def __init__(self, args: argparse.Namespace, out: Path, routers: list[Router]) -> None:
        self.args, self.out, self.routers = args, out, routers
        self.duration = args.duration or (QUICK_DURATION if args.quick else DURATION)
        self.rows: list[Summary] = []
        self.schedules: list[dict[str, Any]] = []
        self.repeats: list[Summary] = []  # with --repeat: every run behind the median rows
        self.started = time.time()

    async def run(self, workloads: list[Workload]) -> None:
        for workload in workloads:
            sweep = [float(q) for q in self.args.qps.split(",")] if self.args.qps else workload.qps(self.args.servers)
            for qps in sweep[:1] if self.args.quick and not self.args.qps else sweep:
                await self.run_point(workload, qps)

    async def run_point(self, workload: Workload, qps: float) -> None:
        requests = generate(workload, qps, self.duration, self.args.seed, self.args.servers)
        self.schedules.append({"workload": workload.name, "qps": qps, "requests": len(requests),
                               "sha256": schedule_digest(requests)})
        self.rows.append(floor_summary(workload.name, qps, request_floors(requests)))
        runs = await self.run_rounds(workload, qps, requests)
        for router in self.routers:
            reason = router.unsupported(workload)
            mine = runs.get(router.name, [])
            self.rows.append(Summary(workload.name, qps, router.name, note=reason) if reason else
                             mine[0] if len(mine) == 1 else median_summary(mine))
        self.save()
        print(markdown([r for r in self.rows if (r.workload, r.qps) == (workload.name, qps)]), flush=True)

    async def run_rounds(self, workload: Workload, qps: float, requests: list[Request]) -> dict[str, list[Summary]]:
        """Every router that supports the workload, ``--repeat`` times, each run on a fresh pool.

        Round by round (A B C, A B C, ...) rather than router by router: the load of this shared machine drifts over
        minutes, and a drift must fall on every router alike, not on whichever ran its repeats last."""
        repeat = self.args.repeat
        runs: dict[str, list[Summary]] = {r.name: [] for r in self.routers if not r.unsupported(workload)}
        for k in range(repeat):
            for router in self.routers:
                if router.name in runs:
                    run = await self.run_one(workload, qps, router, requests, f"-run{k + 1}" if repeat > 1 else "")
                    runs[router.name].append(run)
                    self.repeats += [run] if repeat > 1 else []
                    self.save()
        return runs

    async def run_one(self, workload: Workload, qps: float, router: Router, requests: list[Request],
                      suffix: str = "") -> Summary:
        """One router on a fresh pool; a router that fails to start or serve gives a row with the error."""
        name = router.name.replace(':', '-').replace('/', '_')
        workdir = self.out / "logs" / f"{workload.name}-{qps:g}-{name}{suffix}"
        workdir.mkdir(parents=True, exist_ok=True)
        fleet = SimFleet(workload.pool(self.args.servers), workdir, kv_events=router.needs_kv_events,
                         seed=self.args.seed)
        label = f"{workload.name} {qps:g} QPS {router.name}"
        began = time.monotonic()
        try:
            await fleet.start()
            try:
                url = await router.start(fleet, workdir)
                outcomes = await replay(url, requests, progress=Progress(len(requests), label))
            finally:
                await router.stop()
            counters = await fleet.counters()
            (workdir / "servers.json").write_text(json.dumps(await fleet.info(), indent=1))
        except (RuntimeError, OSError, aiohttp.ClientError) as exc:
            print(f"\n{label}: {exc}", file=sys.stderr)
            return Summary(workload.name, qps, router.name, note=f"error: {str(exc).splitlines()[0][:120]}")
        finally:
            await fleet.stop()
        with open(workdir / "outcomes.jsonl", "w") as f:
            f.writelines(json.dumps(_strict(dataclasses.asdict(o))) + "\n" for o in outcomes)
        row = summarize(workload.name, qps, router.name, outcomes, counters, [s.role for s in fleet.servers])
        row.wall_s = time.monotonic() - began
        return row

    def save(self) -> None:
        data = {"command": "python -m bench.routing " + " ".join(sys.argv[1:]), "seed": self.args.seed,
                "servers": self.args.servers, "duration": self.duration, "started": self.started,
                "host": {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "python": platform.python_version()},
                "tools": {t.name: venvs.installed_version(venvs.venv_dir(t), t.distribution)
                          for t in venvs.TOOLS.values() if venvs.ready(t)},
                "repeat": self.args.repeat, "schedules": self.schedules,
                "runs": [_strict(r.to_json()) for r in self.rows],
                "repeated_runs": [_strict(r.to_json()) for r in self.repeats]}
        (self.out / "results.json").write_text(json.dumps(data, indent=1))
        (self.out / "report.md").write_text(markdown(self.rows))


def event_loop_runner() -> Any:
    """uvloop's runner when installed (less of the client's CPU per streamed chunk), else asyncio's."""
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


def schedule_digest(requests: list[Request]) -> str:
    """SHA-256 over every request's offset, path and body: equal digests, byte-identical schedules."""
    h = hashlib.sha256()
    for r in requests:
        h.update(f"{r.index} {r.offset!r} {r.path} {len(r.body)}\n".encode())
        h.update(r.body)
    return h.hexdigest()


def _strict(value: Any) -> Any:
    """NaN -> None, recursively, so results.json is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    return value


def _verdict(out: Path, rows: list[Summary]) -> None:
    """With peers in the run: print EPP's recommended profiles against the best peer and keep it as verdict.md."""
    runs = [_strict(r.to_json()) for r in rows]
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
