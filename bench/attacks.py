"""Resource-exhaustion attacks on EPP (issue #30): what each costs EPP and the clients it serves meanwhile.

Run::

    python -m bench.attacks                      # every attack at the issue's sizes (8–9 minutes)
    python -m bench.attacks --quick              # smaller counts and bounds (about 3.5 minutes)
    python -m bench.attacks --attacks a,c,f      # some rows (a letter selects its variants: c = c-ping, c-settings)
    python -m bench.attacks --quick --attacks f,g --epp-args "--http-header-timeout 5s --http-body-timeout 5s"
    python -m bench.attacks --compare-grpcio     # also a–e against EPP's grpc.aio ext_proc transport

Each attack gets a fresh ``epp serve`` (its own process, on 127.0.0.1) over 4 simulated vLLM servers, and a
well-behaved client in its own process (:mod:`bench.attacks_probe`: ext_proc calls for a–e, chat completions
through the gateway for f–j). The client's latency is taken for ``--quiet`` seconds just before the attack, then
during it (a window at least as long). Per attack: EPP's RSS growth (peak ``VmRSS`` sampled every 20 ms, minus its
value at the start), EPP's CPU time in the window, the client's latency and failures, when EPP closed the
attack's connections, what the attacker measured, and PASS/FAIL for each target: RSS growth <= 64 MB
(single-connection attacks), p99 <= 2x the quiet p99 with no failed request, every watched connection closed
within its timeout plus ``--slack`` ("-": not judged, the watch ended first). docs/attacks.md has the results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from bench import attacks_probe
from bench.attacks_base import NOT_JUDGED, PRESETS, Outcome, Params, Target, Timeouts
from bench.attacks_h2 import ATTACKS as H2_ATTACKS
from bench.attacks_http1 import ATTACKS as HTTP1_ATTACKS
from bench.attacks_proc import Epp, Probe, RssSampler, Window, window
from bench.gateway_load import Child, cpu_times

__all__ = ["ROWS", "Context", "Row", "Spec", "build_parser", "cells", "endpoints_file", "expected_timeouts", "main",
           "run_row", "selected", "table"]

RSS_LIMIT_MB = 64.0
P99_FACTOR = 2.0
Attack = Callable[[Target, Params], Awaitable[Outcome]]


@dataclass(frozen=True)
class Spec:
    """One row: the attack, the port it hits (``extproc`` or ``gateway``, also the well-behaved client's) and
    whether it uses a single connection (then the RSS limit applies)."""

    name: str
    title: str
    port: str
    single: bool
    attack: Attack


ROWS = [
    Spec("a", "streams with a 10 MiB gRPC message 1 byte short", "extproc", True, H2_ATTACKS["a"]),
    Spec("b", "HEADERS opening concurrent streams", "extproc", True, H2_ATTACKS["b"]),
    Spec("b-reset", "calls reset as soon as sent (Rapid Reset)", "extproc", True, H2_ATTACKS["b-reset"]),
    Spec("c-ping", "PING flood, never reading", "extproc", True, H2_ATTACKS["c-ping"]),
    Spec("c-settings", "SETTINGS flood, never reading", "extproc", True, H2_ATTACKS["c-settings"]),
    Spec("d-continuation", "empty CONTINUATION flood", "extproc", True, H2_ATTACKS["d-continuation"]),
    Spec("d-huffman", "one ~1 MB Huffman-encoded header", "extproc", True, H2_ATTACKS["d-huffman"]),
    Spec("e-preface", "connections never sending the preface", "extproc", False, H2_ATTACKS["e-preface"]),
    Spec("e-idle", "connections idle after the preface", "extproc", False, H2_ATTACKS["e-idle"]),
    Spec("f", "slowloris heads", "gateway", False, HTTP1_ATTACKS["f"]),
    Spec("g-trickle", "bodies trickled after 9 MB", "gateway", False, HTTP1_ATTACKS["g-trickle"]),
    Spec("g-stalled", "bodies stalled just short of 10 MB", "gateway", False, HTTP1_ATTACKS["g-stalled"]),
    Spec("h", "more one-byte heads than file descriptors", "gateway", False, HTTP1_ATTACKS["h"]),
    Spec("i", "127 KiB head in 64-byte pieces", "gateway", True, HTTP1_ATTACKS["i"]),
    Spec("j", "requests naming random models", "gateway", True, HTTP1_ATTACKS["j"]),
]


@dataclass
class Row:
    """One attack's measurements."""

    name: str
    title: str
    transport: str
    single: bool
    facts: dict[str, str]
    closes: str
    closes_verdict: str
    seconds: float
    rss_growth_mb: float
    cpu_s: float
    quiet_cpu_share: float
    quiet: dict[str, float]
    during: dict[str, float]
    epp_survived: bool
    close_times: list[float | None] = field(default_factory=list)
    """Per watched connection, seconds from its opening until EPP closed it (None: open when the watch ended)."""

    def verdicts(self) -> dict[str, str]:
        """PASS, FAIL or "-" (does not apply) per target, "not judged" for closes watched shorter than their
        timeout; the overall verdict: FAIL if one failed (or EPP exited), else "not judged" if one was, else PASS."""
        rss = "-" if not self.single else "PASS" if self.rss_growth_mb <= RSS_LIMIT_MB else "FAIL"
        quiet, during = self.quiet["p99"], self.during["p99"]
        p99 = "FAIL" if (self.during["errors"] or not self.during["requests"] or not during <= P99_FACTOR * quiet) \
            else "PASS"
        marks = [rss, p99, self.closes_verdict]
        overall = "FAIL" if "FAIL" in marks or not self.epp_survived else \
            NOT_JUDGED if NOT_JUDGED in marks else "PASS"
        return {"rss": rss, "p99": p99, "closes": self.closes_verdict, "verdict": overall}


@dataclass
class Context:
    """What every row of a run shares."""

    endpoints: Path
    logs: Path
    params: Params
    epp_args: list[str]
    quiet: float


async def run_row(spec: Spec, transport: str, ctx: Context) -> Row:
    """A fresh EPP, the well-behaved client, the quiet window, then the attack (bounded), and EPP stopped."""
    p = ctx.params
    nofile = p.flood_nofile if spec.name == "h" else 0
    epp = Epp(ctx.endpoints, transport, ctx.logs / f"epp-{spec.name}-{transport}.log", ctx.epp_args, nofile)
    target = await epp.start()
    probe = None
    try:
        probe = Probe(spec.port, target.extproc_port if spec.port == "extproc" else target.gateway_port,
                      max_seconds=_bound(p) + ctx.quiet + 120)
        await probe.ready()
        await asyncio.sleep(0.5)  # past the client's first requests (connection set-up)
        quiet_start, cpu_quiet = time.monotonic(), _cpu(target.pid)
        await asyncio.sleep(ctx.quiet)
        attack_start, cpu_start = time.monotonic(), _cpu(target.pid)
        sampler = RssSampler(target.pid)
        sampler.start()
        try:
            outcome = await asyncio.wait_for(spec.attack(target, p), _bound(p))
        except asyncio.TimeoutError:
            outcome = Outcome({"error": f"the attack overran its {_bound(p):g} s bound"})
        except Exception as exc:  # noqa: BLE001 -- e.g. EPP died under it: the row says so, the run goes on
            outcome = Outcome({"error": f"the attack failed: {exc!r}"})
        # A window at least as long as the quiet one, so both percentiles rest on as many requests.
        await asyncio.sleep(max(0.0, attack_start + ctx.quiet - time.monotonic()))
        attack_end, cpu_end = time.monotonic(), _cpu(target.pid)
        base, peak = sampler.stop()
        samples = await probe.samples()
    finally:
        if probe is not None:
            probe.kill()
        survived = epp.alive
        epp.stop()
    quiet_rate = (cpu_start - cpu_quiet) / (attack_start - quiet_start)
    closes = outcome.closes
    return Row(spec.name, spec.title, transport if spec.port == "extproc" else "gateway", spec.single,
               outcome.facts, closes.summary() if closes else "-",
               closes.verdict(p.timeouts.slack) if closes else "-", attack_end - attack_start,
               (peak - base) / 1024, cpu_end - cpu_start, quiet_rate,
               _window(window(samples, quiet_start, attack_start, within=True)),
               _window(window(samples, attack_start, attack_end, within=False)),
               survived, closes.times if closes else [])


def _bound(p: Params) -> float:
    """The outer time bound of any one attack (each bounds itself well within it)."""
    return p.seconds + p.hold + p.max_wait + max(p.flood_seconds, p.slowloris_seconds or 0.0) + 60.0


def _cpu(pid: int) -> float:
    times = cpu_times(pid)
    return sum(times) if times else 0.0


def _window(w: Window) -> dict[str, float]:
    return {"requests": w.requests, "errors": w.errors, "p50": w.p50, "p99": w.p99, "max": w.max}


# -- the table ----------------------------------------------------------------------------------------------

HEADER = ["attack", "ext_proc transport / port", "EPP RSS growth", "EPP CPU s in the window (quiet share of a core)",
          "client p50 / p99 / max ms during (quiet p99)", "client errors during", "connections closed by EPP",
          "measured by the attacker", "RSS <= 64 MB", "p99 <= 2x quiet", "closed within timeout", "verdict"]


def cells(row: Row) -> list[str]:
    """One row of the markdown table."""
    v = row.verdicts()
    facts = "; ".join(f"{k}: {val}" for k, val in row.facts.items())
    if not row.epp_survived:
        facts = "EPP EXITED; " + facts
    q, d = row.quiet, row.during
    return [f"{row.name}: {row.title}", row.transport, f"{row.rss_growth_mb:,.1f} MB",
            f"{row.cpu_s:.2f} in {row.seconds:.0f} s ({row.quiet_cpu_share:.0%})",
            f"{d['p50']:.1f} / {d['p99']:.1f} / {d['max']:.0f} ({q['p99']:.1f})",
            f"{d['errors']:.0f} of {d['requests']:.0f}",
            row.closes, facts, v["rss"], v["p99"], v["closes"], v["verdict"]]


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in cells(r)) + " |" for r in rows]
    return "\n".join(lines)


# -- the run ------------------------------------------------------------------------------------------------

def selected(names: str) -> list[Spec]:
    """The rows ``--attacks`` names (a letter selects all its variants)."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if not any(s.name == n or s.name.startswith(n + "-") for s in ROWS)]
    if unknown:
        raise SystemExit(f"unknown attacks: {', '.join(unknown)} (known: {', '.join(s.name for s in ROWS)})")
    return [s for s in ROWS if any(s.name == n or s.name.startswith(n + "-") for n in wanted)]


async def run(args: argparse.Namespace) -> list[Row]:
    """Every selected row (and the grpc.aio comparison), each printed as it lands."""
    p = replace(PRESETS["quick" if args.quick else "full"], timeouts=expected_timeouts(args))
    if args.slowloris_seconds:
        p = replace(p, slowloris_seconds=args.slowloris_seconds)
    if args.max_wait:
        p = replace(p, max_wait=args.max_wait)
    plan = [(s, "native") for s in selected(args.attacks)]
    if args.compare_grpcio:
        plan += [(s, "grpcio") for s, _ in plan if s.port == "extproc"]
    backend = Child("_backend", "--backend", "sim", "--latency", "0.01", "--tokens", "16")
    rows: list[Row] = []
    try:
        with tempfile.TemporaryDirectory(prefix="epp-attacks-") as tmp:
            ctx = Context(endpoints_file(Path(tmp), backend.info["ports"]), Path(args.logs or tmp), p,
                          shlex.split(args.epp_args), args.quiet if args.quiet is not None else
                          (2.0 if args.quick else 3.0))
            ctx.logs.mkdir(parents=True, exist_ok=True)
            for spec, transport in plan:
                rows.append(await run_row(spec, transport, ctx))
                print(" | ".join(cells(rows[-1])), flush=True)
    finally:
        backend.stop()
    return rows


EPP_TIMEOUT_FLAGS = {"head": "--http-header-timeout", "body": "--http-body-timeout"}
"""The `epp serve` flags that set a timeout the benchmark judges (the HTTP/2 ones have no flag)."""


def expected_timeouts(args: argparse.Namespace) -> Timeouts:
    """The timeouts to judge closes against: this benchmark's flag when given, else the value of EPP's own flag in
    ``--epp-args``, else EPP's default (:class:`Timeouts`)."""
    from epp.cli.argtypes import duration_arg

    given = argparse.ArgumentParser(add_help=False)
    for name, flag in EPP_TIMEOUT_FLAGS.items():
        given.add_argument(flag, dest=name, type=duration_arg)
    epp, _ = given.parse_known_args(shlex.split(args.epp_args))
    values = {name: getattr(args, f"{name}_timeout") for name in ("preface", "idle", "head", "body")}
    for name, value in values.items():
        if value is None:  # EPP's 0 (no limit) leaves its default as the expectation
            values[name] = getattr(epp, name, None) or getattr(Timeouts(), name)
    return Timeouts(**values, slack=args.slack)


def endpoints_file(directory: Path, ports: list[int]) -> Path:
    path = directory / "endpoints.yaml"
    path.write_text("endpoints:\n" + "".join(f"  - {{name: sim-{i}, address: 127.0.0.1, port: {port}}}\n"
                                             for i, port in enumerate(ports)))
    return path


def build_parser() -> argparse.ArgumentParser:
    t = Timeouts()
    p = argparse.ArgumentParser(prog="python -m bench.attacks", description=__doc__.split("\n\n")[0])
    p.add_argument("--attacks", default=",".join(s.name for s in ROWS), help="comma-separated rows or letters")
    p.add_argument("--quick", action="store_true", help="smaller counts and bounds")
    p.add_argument("--compare-grpcio", action="store_true", help="also run a–e against --extproc-transport grpcio")
    p.add_argument("--epp-args", default="", help="extra `epp serve` flags (one shell-quoted string), applied last")
    p.add_argument("--quiet", type=float, help="seconds of the quiet window before each attack (3; 2 with --quick)")
    p.add_argument("--preface-timeout", type=float,
                   help=f"seconds EPP may take to close a connection without the HTTP/2 preface ({t.preface:g})")
    p.add_argument("--idle-timeout", type=float,
                   help=f"... an HTTP/2 connection without streams after the preface ({t.idle:g})")
    p.add_argument("--head-timeout", type=float,
                   help=f"... an HTTP/1.1 connection whose request head is incomplete (default: "
                        f"--http-header-timeout in --epp-args, else {t.head:g})")
    p.add_argument("--body-timeout", type=float,
                   help=f"... an HTTP/1.1 connection whose request body stopped arriving (default: "
                        f"--http-body-timeout in --epp-args, else {t.body:g})")
    p.add_argument("--slack", type=float, default=t.slack, help=f"seconds allowed past each timeout ({t.slack:g})")
    p.add_argument("--slowloris-seconds", type=float,
                   help="how long f runs (default: the head timeout + --slack + one 10 s interval, when that is "
                        "within --max-wait)")
    p.add_argument("--max-wait", type=float, help="longest any close is waited for (125; 13 with --quick); a row "
                                                   "whose timeout + slack is longer watches only 10 s (4 with "
                                                   "--quick) and is not judged")
    p.add_argument("--logs", help="keep EPP's logs in this directory (default: a temporary one)")
    p.add_argument("--json", help="also write the rows as JSON to this file")
    sub = p.add_subparsers(dest="role")
    attacks_probe.add_arguments(sub.add_parser("_probe"))
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point: the benchmark, or the well-behaved client's process role."""
    args = build_parser().parse_args(argv)
    if args.role == "_probe":
        attacks_probe.run(args)
        return 0
    # SIGTERM unwinds like Ctrl-C, so every `finally` stops what it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = asyncio.run(run(args))
    print()
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) | {"verdicts": r.verdicts()} for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
