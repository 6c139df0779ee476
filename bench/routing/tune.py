"""``python -m bench.routing.tune``: searches a profile's parameters and scorer weights on the simulator.

One schedule (a benchmark workload at one QPS, ``--workload W --qps Q``, or a recorded trace, ``--trace FILE``) is
sent through EPP's gateway once per candidate profile, each run on a fresh simulated pool with cold caches, as
``python -m bench.routing`` runs a router (``--repeat``: round by round, medians). A candidate is the base profile
(``--config``) with one value per ``--vary`` axis: ``PLUGIN.PARAMETER=v1,v2`` (a plugin's parameter, the plugin by its
name) or ``PROFILE/PLUGIN=w1,w2`` (a weight in a scheduling profile); the grid is every combination, the base first.
Candidates are ranked by ``--objective`` (lower is better) among those the guard lets through: no failed request, and
E2E p99 and output throughput at most ``--guard`` worse than the base's in the same run. The winner (the base when
nothing beats it) is written to ``OUT/tuned.yaml``; the ranked table goes to stdout and ``OUT/tune.md``.
A trace is JSON lines ``{"offset": seconds, "body": {...}, "path": "/v1/chat/completions"}`` (path optional); bodies
are sent streamed with the usage requested, so that TTFT and tokens can be measured. Usage: docs/routing.md.
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from bench.routing.report import Summary, median_summary
from bench.routing.routers import make_router
from bench.routing.runs import Bench, Settings, event_loop_runner
from bench.routing.workloads import WORKLOADS, Request, Workload, generate, uniform_pool
from epp.config.loader import config_error_text, load_config
from epp.errors import ConfigError
from epp.framework.registry import Registry
from epp.runtime.builtins import default_registry

__all__ = ["Axis", "Candidate", "parse_axis", "grid", "load_trace", "rank", "main"]

OBJECTIVES = {"ttft_p50": lambda s: s.ttft_ms[0], "ttft_p90": lambda s: s.ttft_ms[1],
              "ttft_p99": lambda s: s.ttft_ms[2], "e2e_p99": lambda s: s.e2e_p99_ms}
TRACE_PATHS = ("/v1/chat/completions", "/v1/completions")
MAX_CANDIDATES = 64
"""More than this would run for hours at 30 s per run; the grid is refused instead of started."""


@functools.cache
def _registry() -> Registry:
    return default_registry()


class TuneError(ValueError):
    """A --vary axis, base profile or trace that cannot be used; the message says which and where."""


@dataclass(frozen=True)
class Axis:
    """One ``--vary`` axis: a plugin's parameter (``profile`` empty) or a plugin's weight in ``profile``."""

    text: str
    plugin: str
    parameter: str
    profile: str
    values: tuple[Any, ...]


@dataclass
class Candidate:
    """The base profile with ``changes`` (axis text -> value; empty for the base itself) applied."""

    changes: dict[str, Any]
    config: dict[str, Any]
    summary: Summary | None = None
    rejected: str = ""  # why the guard keeps it out; empty: it may win


def parse_axis(text: str) -> Axis:
    """``PLUGIN.PARAMETER=v1,v2`` or ``PROFILE/PLUGIN=w1,w2``; each value is read as YAML (1, 0.5, true, a string)."""
    name, sep, values = text.partition("=")
    if not sep or not name or not values:
        raise TuneError(f"--vary {text!r}: expected PLUGIN.PARAMETER=v1,v2,... or PROFILE/PLUGIN=w1,w2,...")
    parsed = tuple(yaml.safe_load(v) for v in values.split(","))
    if "/" in name:
        profile, _, plugin = name.partition("/")
        return Axis(text, plugin, "", profile, parsed)
    plugin, dot, parameter = name.rpartition(".")
    if not dot or not plugin or not parameter:
        raise TuneError(f"--vary {text!r}: {name!r} is neither PLUGIN.PARAMETER nor PROFILE/PLUGIN")
    return Axis(text, plugin, parameter, "", parsed)


def _plugin(config: dict[str, Any], axis: Axis) -> dict[str, Any]:
    for entry in config.get("plugins") or []:
        if entry.get("name", entry.get("type")) == axis.plugin:
            return entry
    names = [e.get("name", e.get("type")) for e in config.get("plugins") or []]
    raise TuneError(f"--vary {axis.text!r}: the base profile has no plugin named {axis.plugin!r} (it has {names})")


def _ref(config: dict[str, Any], axis: Axis) -> dict[str, Any]:
    profiles = config.get("schedulingProfiles") or []
    profile = next((p for p in profiles if p.get("name") == axis.profile), None)
    if profile is None:
        raise TuneError(f"--vary {axis.text!r}: the base profile has no scheduling profile named {axis.profile!r} "
                        f"(it has {[p.get('name') for p in profiles]})")
    ref = next((r for r in profile.get("plugins") or [] if r.get("pluginRef") == axis.plugin), None)
    if ref is None:
        raise TuneError(f"--vary {axis.text!r}: scheduling profile {axis.profile!r} has no pluginRef {axis.plugin!r}")
    return ref


def current(config: dict[str, Any], axis: Axis) -> Any:
    """The value ``axis`` has in ``config``, the plugin's default or a weight of 1 when the file does not set it
    (so that a grid value equal to the default is not a change)."""
    if axis.profile:
        weight = _ref(config, axis).get("weight")
        return 1 if weight is None else weight  # the scheduler's weight for a scorer listed without one
    entry = _plugin(config, axis)
    params = entry.get("parameters") or {}
    if axis.parameter in params:
        return params[axis.parameter]
    try:
        effective = _registry().validate_params(entry["type"], axis.plugin, params).model_dump(by_alias=True)
    except (ConfigError, KeyError):
        return None  # an unknown type or parameter: the candidates' validation names it
    return effective.get(axis.parameter)


def apply(config: dict[str, Any], axis: Axis, value: Any) -> None:
    """Set ``value`` on ``axis`` in ``config``, in place."""
    if axis.profile:
        _ref(config, axis)["weight"] = value
        return
    entry = _plugin(config, axis)
    entry["parameters"] = {**(entry.get("parameters") or {}), axis.parameter: value}


def grid(base: dict[str, Any], axes: list[Axis]) -> list[Candidate]:
    """The base, then every combination of the axes' values that differs from it, each once."""
    for axis in axes:
        current(base, axis)  # a wrong plugin or profile name fails here, before anything runs
    out = [Candidate({}, base)]
    for combo in itertools.product(*(axis.values for axis in axes)):
        changes = {a.text.partition("=")[0]: v for a, v in zip(axes, combo) if v != current(base, a)}
        if not changes or any(c.changes == changes for c in out):
            continue
        config = copy.deepcopy(base)
        for axis, value in zip(axes, combo):
            apply(config, axis, value)
        out.append(Candidate(changes, config))
    return out


def load_trace(path: Path) -> list[Request]:
    """A recorded trace's requests, by offset; a line that is not a request raises naming the file and line."""
    items: list[tuple[float, str, bytes]] = []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
            offset, body, route = float(record["offset"]), record["body"], record.get("path", TRACE_PATHS[0])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise TuneError(f"{path}:{number}: not a trace line ({exc!r}); expected "
                            '{"offset": seconds, "body": {...}}') from exc
        if not isinstance(body, dict) or not math.isfinite(offset) or offset < 0 or route not in TRACE_PATHS:
            raise TuneError(f"{path}:{number}: needs a finite offset >= 0, a JSON object body and a path among "
                            f"{TRACE_PATHS}")
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}  # TTFT and tokens are measured
        items.append((offset, route, orjson.dumps(body)))
    if not items:
        raise TuneError(f"{path}: the trace holds no request")
    items.sort(key=lambda item: item[0])
    return [Request(i, offset, route, body) for i, (offset, route, body) in enumerate(items)]


def rank(candidates: list[Candidate], objective: str, guard: float) -> list[Candidate]:
    """The candidates best first by ``objective`` among those the guard lets through, then the rest, each marked
    with why it was kept out. The base (first) is the guard's reference."""
    base, key = candidates[0].summary, OBJECTIVES[objective]
    for c in candidates:
        s = c.summary
        if s is None or s.note or not s.requests:
            c.rejected = f"did not run: {s.note if s else 'no result'}"
        elif s.failed:
            c.rejected = f"{s.failed} failed"
        elif base is not None and c is not candidates[0] and s.e2e_p99_ms > base.e2e_p99_ms * (1 + guard):
            c.rejected = f"E2E p99 {s.e2e_p99_ms / base.e2e_p99_ms:.3f}x the base's"
        elif base is not None and c is not candidates[0] and s.output_tok_s < base.output_tok_s * (1 - guard):
            c.rejected = f"throughput {s.output_tok_s / base.output_tok_s:.3f}x the base's"
        elif math.isnan(key(s)):
            c.rejected = f"no {objective}"
    passed = sorted((c for c in candidates if not c.rejected), key=lambda c: key(c.summary))
    return passed + [c for c in candidates if c.rejected]


def _changes(candidate: Candidate) -> str:
    return ", ".join(f"{k}={v}" for k, v in candidate.changes.items())


def table(ranked: list[Candidate], objective: str) -> str:
    """The ranked candidates as a markdown table."""
    lines = [f"| # | changes from the base | {objective} ms | TTFT p50 / p90 / p99 ms | E2E p99 ms | output tok/s | "
             "hit rate | failed | guard |", "|---:|---|---:|---|---:|---:|---:|---:|---|"]
    for n, c in enumerate(ranked, 1):
        s = c.summary or Summary("", 0, "")
        hit = "-" if math.isnan(s.hit_rate) else f"{s.hit_rate:.1%}"
        lines.append(f"| {n} | {_changes(c) or '(the base)'} | {OBJECTIVES[objective](s):,.1f} | "
                     f"{' / '.join(f'{v:,.1f}' for v in s.ttft_ms)} | {s.e2e_p99_ms:,.0f} | {s.output_tok_s:,.0f} | "
                     f"{hit} | {s.failed} / {s.requests} | {c.rejected or 'ok'} |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.routing.tune", description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="the base profile (an EndpointPickerConfig file)")
    p.add_argument("--vary", action="append", default=[], required=True,
                   help="PLUGIN.PARAMETER=v1,v2,... or PROFILE/PLUGIN=w1,w2,... (repeatable: the grid is the product)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--workload", choices=sorted(WORKLOADS), help="a benchmark workload (with --qps)")
    source.add_argument("--trace", type=Path, help="a recorded trace: JSON lines {offset, body[, path]}")
    p.add_argument("--qps", type=float, help="the workload's QPS (default: the top of its sweep)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of a workload's arrivals (default 30)")
    p.add_argument("--objective", choices=sorted(OBJECTIVES), default="ttft_p90")
    p.add_argument("--guard", type=float, default=0.02,
                   help="how much worse than the base a candidate's E2E p99 and throughput may be (default 0.02)")
    p.add_argument("--repeat", type=int, default=1, help="runs per candidate, round by round; medians (default 1)")
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, help="results directory (default tune-results/<time>)")
    return p


def _schedule(args: argparse.Namespace) -> tuple[Workload, float, list[Request]]:
    if args.trace is not None:
        requests = load_trace(args.trace)
        span = max(r.offset for r in requests) or 1.0
        qps = round(len(requests) / span, 2)
        return Workload("trace", str(args.trace), lambda *_: requests, uniform_pool, lambda _: [qps]), qps, requests
    workload = WORKLOADS[args.workload]
    qps = args.qps or workload.qps(args.servers)[-1]
    return workload, qps, generate(workload, qps, args.duration, args.seed, args.servers)


def _validate(candidates: list[Candidate], out: Path) -> list[str]:
    """Write each candidate's YAML under ``out/candidates``; raise ConfigError naming the first invalid one."""
    registry, paths = _registry(), []
    for n, c in enumerate(candidates):
        path = out / "candidates" / f"c{n:02d}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(c.config, sort_keys=False))
        try:
            load_config(path, registry)
        except ConfigError as exc:
            raise TuneError(f"candidate {_changes(c) or 'the base'}: {config_error_text(exc)}") from exc
        paths.append(str(path.resolve()))
    return paths


def _write_winner(ranked: list[Candidate], args: argparse.Namespace, where: str, out: Path) -> Candidate:
    best = ranked[0] if not ranked[0].rejected else next(c for c in ranked if not c.changes)
    header = (f"# Tuned by python -m bench.routing.tune on {where}, objective {args.objective}, guard {args.guard:g}.\n"
              f"# Base: {args.config}. Changes: {_changes(best) or 'none (no candidate beat the base)'}.\n")
    (out / "tuned.yaml").write_text(header + yaml.safe_dump(best.config, sort_keys=False))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.repeat < 1 or not 0 <= args.guard < 1:
        parser.error("--repeat must be at least 1 and --guard in [0, 1)")
    if args.trace is not None and args.qps is not None:
        parser.error("--qps is for --workload: a trace's requests keep their recorded offsets")
    out: Path = args.out or Path("tune-results") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    try:
        load_config(args.config, _registry())  # the base must load as it is, before the grid is built from it
        base = yaml.safe_load(args.config.read_text())
        candidates = grid(base, [parse_axis(v) for v in args.vary])
        if len(candidates) > MAX_CANDIDATES:
            raise TuneError(f"the grid has {len(candidates)} candidates, more than {MAX_CANDIDATES}; vary fewer values")
        workload, qps, requests = _schedule(args)
        paths = _validate(candidates, out)
    except ConfigError as exc:
        print(f"error: the base profile: {config_error_text(exc)}", file=sys.stderr)
        return 2
    except (TuneError, OSError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = Settings(duration=args.duration, repeat=args.repeat, servers=args.servers, seed=args.seed)
    routers = [make_router(f"epp:{path}") for path in paths]
    bench = Bench(settings, out, routers)
    runs = event_loop_runner()(bench.run_rounds(workload, qps, requests))
    for candidate, router in zip(candidates, routers):
        mine = runs.get(router.name, [])
        candidate.summary = mine[0] if len(mine) == 1 else median_summary(mine) if mine else None
    ranked = rank(candidates, args.objective, args.guard)
    where = f"{workload.name} at {qps:g} QPS ({len(requests)} requests, seed {args.seed}, {args.servers} servers)"
    text = f"**{where}**, objective {args.objective}, medians of {args.repeat}\n\n" + table(ranked, args.objective)
    (out / "tune.md").write_text(text + "\n")
    best = _write_winner(ranked, args, where, out)
    print(f"{text}\n\nwritten: {out / 'tuned.yaml'} ({_changes(best) or 'the base'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
