"""Runs of the routing benchmark: every (workload, QPS, router) on a fresh simulated pool, recorded as rows.

:class:`Bench` generates each point's seeded schedule, states its floor, runs every router that supports the workload
``--repeat`` times round by round (:meth:`Bench.run_rounds`, which the tuner reuses for its candidates), each on a cold
pool it starts and stops, and writes ``results.json`` and ``report.md`` after every run. :func:`schedule_digest`
fingerprints a schedule; :func:`strict` makes a row strict JSON; :func:`event_loop_runner` picks uvloop when present;
:func:`where_served` notes in each outcome which servers took the request (``outcomes.jsonl``'s ``servers``).
:class:`Settings` is what a run is given, from the command line or the tuner.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.routing import venvs
from bench.routing.floor import request_floors
from bench.routing.pool import SimFleet
from bench.routing.report import Summary, floor_summary, markdown, median_summary, summarize
from bench.routing.routers import Router
from bench.routing.runner import Outcome, Progress, replay
from bench.routing.workloads import Request, Workload, generate
from epp_sim import load_tokenizer
from epp_sim.served import prompt_key

__all__ = ["DURATION", "OUTCOMES", "QUICK_DURATION", "Bench", "Settings", "event_loop_runner", "load_outcomes",
           "point_prefix", "schedule_digest", "strict", "where_served"]

DURATION = 60.0
QUICK_DURATION = 10.0


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every run of a benchmark shares: seconds of arrivals, runs per router and point, pool size and seed, and
    the QPS to run (None: each workload's own sweep, only its lowest point when ``quick``)."""

    duration: float = DURATION
    repeat: int = 1
    servers: int = 4
    seed: int = 1
    qps: tuple[float, ...] | None = None
    quick: bool = False
    tokenizer: Path | None = None  # a folder from bench.routing.tokenizer; None: the simulator's built-in one


class Bench:
    """Runs every (workload, QPS, router) and records the rows."""

    def __init__(self, settings: Settings, out: Path, routers: list[Router]) -> None:
        self.settings, self.out, self.routers = settings, out, routers
        self.rows: list[Summary] = []
        self.schedules: list[dict[str, Any]] = []
        self.repeats: list[Summary] = []  # with --repeat: every run behind the median rows
        self.started = time.time()
        self._tokenizer = load_tokenizer(str(settings.tokenizer / "tokenizer.json") if settings.tokenizer else None)

    async def run(self, workloads: list[Workload]) -> None:
        for workload in workloads:
            settings = self.settings
            sweep = list(settings.qps) if settings.qps else workload.qps(settings.servers)
            for qps in sweep[:1] if settings.quick and not settings.qps else sweep:
                await self.run_point(workload, qps)

    async def run_point(self, workload: Workload, qps: float) -> None:
        requests = generate(workload, qps, self.settings.duration, self.settings.seed, self.settings.servers)
        self.schedules.append({"workload": workload.name, "qps": qps, "requests": len(requests),
                               "sha256": schedule_digest(requests)})
        self.rows.append(floor_summary(workload.name, qps, request_floors(requests, tokenizer=self._tokenizer)))
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
        repeat = self.settings.repeat
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
        workdir = self.out / "logs" / f"{point_prefix(workload.name, qps)}{name}{suffix}"
        workdir.mkdir(parents=True, exist_ok=True)
        fleet = SimFleet(workload.pool(self.settings.servers), workdir, kv_events=router.needs_kv_events,
                         seed=self.settings.seed, tokenizer=self.settings.tokenizer)
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
            where_served(requests, outcomes, await fleet.served())
        except (RuntimeError, OSError, aiohttp.ClientError) as exc:
            print(f"\n{label}: {exc}", file=sys.stderr)
            return Summary(workload.name, qps, router.name, note=f"error: {str(exc).splitlines()[0][:120]}")
        finally:
            await fleet.stop()
        with open(workdir / OUTCOMES, "w") as f:
            f.writelines(json.dumps(strict(dataclasses.asdict(o))) + "\n" for o in outcomes)
        row = summarize(workload.name, qps, router.name, outcomes, counters, [s.role for s in fleet.servers])
        row.wall_s = time.monotonic() - began
        return row

    def save(self) -> None:
        data = {"command": "python -m bench.routing " + " ".join(sys.argv[1:]), "seed": self.settings.seed,
                "servers": self.settings.servers, "duration": self.settings.duration, "started": self.started,
                "host": {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "python": platform.python_version()},
                "tools": {t.name: venvs.installed_version(venvs.venv_dir(t), t.distribution)
                          for t in venvs.TOOLS.values() if venvs.ready(t)},
                "repeat": self.settings.repeat, "schedules": self.schedules,
                "tokenizer": str(self.settings.tokenizer) if self.settings.tokenizer else "built-in",
                "runs": [strict(r.to_json()) for r in self.rows],
                "repeated_runs": [strict(r.to_json()) for r in self.repeats]}
        (self.out / "results.json").write_text(json.dumps(data, indent=1))
        (self.out / "report.md").write_text(markdown(self.rows))


OUTCOMES = "outcomes.jsonl"
"""Each run's file under ``logs/<point_prefix><router>[-runN]/``: one :class:`Outcome` per line, as JSON."""


def point_prefix(workload: str, qps: float) -> str:
    """How the log directories of a (workload, QPS) point's runs begin."""
    return f"{workload}-{qps:g}-"


def load_outcomes(path: Path) -> list[Outcome]:
    """A run's ``outcomes.jsonl`` back as outcomes (keys an older or newer file has beyond them are ignored)."""
    fields = set(Outcome.__dataclass_fields__)
    with open(path) as f:
        return [Outcome(**{k: v for k, v in json.loads(line).items() if k in fields}) for line in f if line.strip()]


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


def where_served(requests: list[Request], outcomes: list[Outcome], served: list[list[str]]) -> None:
    """Set each outcome's ``servers`` (indexes into the pool) from the servers' ``/sim/served`` keys. A request whose
    prompt another request of the schedule repeats exactly cannot be told apart and keeps None; so does one no
    server recorded. Under P/D both the prefill and the decode server are listed."""
    keys = {r.index: prompt_key(orjson.loads(r.body)) for r in requests}
    repeated = {k for k, n in Counter(keys.values()).items() if n > 1}
    where: dict[str, list[int]] = {}
    for i, server_keys in enumerate(served):
        for k in set(server_keys):
            where.setdefault(k, []).append(i)
    for outcome in outcomes:
        k = keys.get(outcome.index)
        if k is not None and k not in repeated and k in where:
            outcome.servers = where[k]


def strict(value: Any) -> Any:
    """NaN -> None, recursively, so results.json is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    return value
