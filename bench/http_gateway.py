"""HTTP gateway benchmark: a direct connection to one model server vs EPP's gateway over 4.

Run: ``python -m bench.http_gateway`` (``--quick`` for a short run; ``--seconds``, ``--concurrency``,
``--tokens``, ``--profile DIR`` to write a cProfile of each EPP process, ``--backend sim`` for the simulator,
``--transports lean,aiohttp+lean,aiohttp`` for the HTTP stacks (server+upstream client) measured side by side,
``--profiles`` for the scheduling profiles, ``--tracing off,on`` to measure EPP with OpenTelemetry tracing at 100%
sampling too).

Separate processes, so that CPU accounting is clean:

* **backend**: 4 OpenAI-compatible model servers in one process (one event loop, like ``epp_sim.SimPool``),
  :class:`bench.fixed_backend.FixedBackend`.
  The default ``fixed`` backend is a tiny aiohttp server with a fixed latency per request (0 = *CPU-bound*: the
  answer is immediate and throughput is bounded by CPU; 20 ms = a typical short generation) and SSE streams of
  ``--tokens`` chunks (half the latency before the first token, the rest spread over the others). A fixed
  backend costs a few µs of CPU per request, so the differences measured are the gateway's. Stream tokens are
  paced by a timer per stream (``--pacing request``: tokens of the 32 streams reach the router one at a time,
  the costliest case for any proxy) and/or by one step clock per server that all its streams share
  (``--pacing step``: each server's tokens leave together, one per running stream per step, as vLLM's
  continuous batching emits them; the 4 servers' clocks are out of phase). ``--backend sim``
  runs ``epp_sim`` servers instead (time model scaled so one request takes about the same latency); the
  simulator's own CPU then dominates the CPU-bound numbers.
* **EPP**: ``epp.gateway`` on uvloop over the 4 servers, with either a round-robin-like profile (only
  ``random-picker``) or the reference's default profile (queue 2, kv-cache 2, prefix-cache 3, max-score), and
  on EPP's own HTTP server and upstream client (``lean``, the default) or aiohttp's (``aiohttp``), or a mix
  (``aiohttp+lean``: aiohttp's server, the lean client), each in its own EPP process.
  EPP records its own Prometheus metrics as ``epp serve`` does; no metrics scraping runs (the fixed backend has
  no ``/metrics``), so the CPU measured is the request path.
* **floor** (``--floor``): ``bench.byte_relay``, a TCP byte relay over the same servers, in its own process.
* **other routers** (``--vllm-router CMD``, ``--production-stack CMD``): vLLM's Rust router and vLLM
  production-stack's Python router, round robin over the same servers, each in its own process, measured alike.
* **OTLP sink** (``--tracing on``): an OpenTelemetry collector stand-in in its own process (``_otlp``: the OTLP
  gRPC trace service, answering every export and keeping nothing). EPP exports to it as ``epp serve`` does: the
  OTLP gRPC exporter behind a ``BatchSpanProcessor``, so the CPU measured includes encoding and sending the spans.
* **load generator**: this process, aiohttp on uvloop, ``--concurrency`` workers (32) on keep-alive connections.

Per scenario it reports req/s, latency p50/p99 (to the end of the answer), EPP CPU per request (the EPP
process's user+system CPU time during the measured window, from ``/proc/<pid>/stat``, divided by the requests
completed), the kernel's part of it (the system time: socket reads, writes and waits, which a byte relay pays
too; both figures from the run with the median CPU) and, at concurrency 1, the TTFT added by EPP (p50 of time to
the first ``data:`` line, or to the whole answer when not streaming, through EPP minus direct; per-request pacing
only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import aiohttp
from aiohttp import web

from bench.byte_relay import serve_relay
from bench.fixed_backend import MODEL, FixedBackend
from bench.gateway_load import Child, Result, load, run_loop, table
from epp.runtime.ports import free_ports

SERVERS = 4
RR_CONFIG = """\
plugins:
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
"""

# ---------------------------------------------------------------------------------------------- backend


async def _serve_backend(args: argparse.Namespace) -> None:
    runners = []
    if args.backend == "sim":
        from epp_sim import SimConfig, SimPool, TimeModel

        # One request of ~300 prompt tokens and `tokens` output tokens ~= `latency` seconds of wall time.
        step = TimeModel().step_overhead_s
        scale = max(1e-6, args.latency / max(1, args.tokens) / step)
        pool = SimPool([SimConfig(model=MODEL, time_scale=scale, seed=i) for i in range(SERVERS)])
        await pool.start()
        ports = [s.port for s in pool.servers]
    else:
        ports = []
        for i in range(SERVERS):  # step pacing: the servers' clocks are out of phase, as separate servers are
            backend = FixedBackend(args.latency, args.tokens, args.pacing, phase=i / SERVERS)
            runner = web.AppRunner(backend.app(), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
            runners.append(runner)
            ports.append(runner.addresses[0][1])
    print(json.dumps({"ports": ports}), flush=True)
    await asyncio.Event().wait()


# ---------------------------------------------------------------------------------------------- OTLP sink


async def serve_otlp_sink() -> None:
    """An OTLP gRPC trace receiver on 127.0.0.1 (port printed as JSON) that answers every export and keeps
    nothing: where EPP's spans go when a benchmark measures tracing (``bench.extproc`` starts it too)."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    class Sink(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        spans = 0

        async def Export(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802 -- gRPC's name
            Sink.spans += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Sink(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(json.dumps({"port": port}), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    print(json.dumps({"spans": Sink.spans}), flush=True)
    await server.stop(1)


def otlp_environment(port: int) -> dict[str, str]:
    """The environment that points an EPP process's tracing at the sink on ``port``, sampling every request."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_TRACES_SAMPLER_ARG": "1.0"}


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment (so the children started meanwhile inherit them), then undone."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------------------------------------- EPP


async def _serve_epp(args: argparse.Namespace) -> None:
    from prometheus_client import CollectorRegistry

    from epp.config.loader import DEFAULT_CONFIG_TEXT, build_pipeline, load_raw
    from epp.datalayer.datastore import Datastore
    from epp.framework.endpoint import EndpointSpec
    from epp.gateway import GatewayServer, make_gateway_app
    from epp.metrics.families import EppMetrics
    from epp.observability import Observer, build_tracing
    from epp.runtime.app import instrument_pipeline
    from epp.runtime.builtins import default_registry
    from epp.scheduling.director import Director

    text = RR_CONFIG if args.profile_name == "round-robin" else DEFAULT_CONFIG_TEXT
    datastore = Datastore()
    datastore.replace_all([EndpointSpec(f"server-{i}", "127.0.0.1", int(p))
                           for i, p in enumerate(args.upstreams.split(","))])
    datastore.mark_synced()
    # The request path as `epp serve` runs it: EPP's Prometheus metrics recorded (plugin durations included).
    pipeline = build_pipeline(*load_raw(text), default_registry())
    metrics = EppMetrics(CollectorRegistry())
    instrument_pipeline(pipeline, metrics)
    # --tracing: as `epp serve --tracing` builds it, exporting over OTLP to the sink the environment names.
    tracing = build_tracing() if args.tracing == "on" else None
    director = Director(pipeline, datastore, metrics=metrics,
                        observer=Observer(tracing) if tracing is not None else None)
    frontend, _, client = args.transport.partition("+")
    app = make_gateway_app(director, transport=client or frontend)
    async with GatewayServer(app, "127.0.0.1", 0, backlog=1024, frontend=frontend) as server:
        print(json.dumps({"port": server.port}), flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
    if tracing is not None:
        tracing.shutdown()


def _run_epp(args: argparse.Namespace) -> None:
    from epp.gateway import run

    if not args.cprofile:
        run(_serve_epp(args))
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        run(_serve_epp(args))
    finally:
        profiler.disable()
        profiler.dump_stats(args.cprofile)


@dataclass
class Summary:
    """One scenario: medians over the repeats."""

    rps: float
    p50: float
    p99: float
    cpu_ms: float | None = None
    system_ms: float | None = None  # the kernel's part of cpu_ms
    added_ttft_ms: float | None = None
    errors: int = 0


async def _measure(url: str, direct_url: str, stream: bool, args: argparse.Namespace,
                   pid: int | None) -> Summary:
    """``args.repeat`` rounds of: loaded run at ``args.concurrency``; then concurrency-1 runs direct and
    through ``url`` back to back (so drift in the machine's speed cancels out of the added TTFT)."""
    runs: list[Result] = []
    added: list[float] = []
    for _ in range(args.repeat):
        runs.append(await load(url, stream=stream, concurrency=args.concurrency, seconds=args.seconds,
                               cpu_pid=pid))
        if url != direct_url and args.ttft_requests:
            base = await load(direct_url, stream=stream, concurrency=1, count=args.ttft_requests, warmup=0.2)
            via = await load(url, stream=stream, concurrency=1, count=args.ttft_requests, warmup=0.2)
            added.append(statistics.median(via.ttfts) - statistics.median(base.ttfts))
    cpu = _median_cpu(runs)
    return Summary(statistics.median(r.rps for r in runs), statistics.median(r.pct(0.5) for r in runs),
                   statistics.median(r.pct(0.99) for r in runs), cpu[0] if cpu else None, cpu[1] if cpu else None,
                   statistics.median(added) * 1e3 if added else None, sum(r.errors for r in runs))


def _median_cpu(runs: list[Result]) -> tuple[float, float] | None:
    """(CPU, of it kernel) ms per request of the run whose CPU per request is the median (the lower middle
    one for an even count), so both figures come from one run; None without CPU figures."""
    timed = sorted((r.cpu_s / r.requests, r.system_s / r.requests) for r in runs
                   if r.cpu_s is not None and r.system_s is not None and r.requests)
    if not timed:
        return None
    total, system = timed[(len(timed) - 1) // 2]
    return total * 1e3, system * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_gateway", description=__doc__.split("\n")[0])
    parser.add_argument("role", nargs="?", default="bench", choices=["bench", "_backend", "_epp", "_relay", "_otlp"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run (default 8)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=16, help="output tokens (SSE chunks) per answer")
    parser.add_argument("--ttft-requests", type=int, default=300, help="sequential requests for added TTFT")
    parser.add_argument("--latencies", default="0,0.02", help="backend latencies in seconds (default 0,0.02)")
    parser.add_argument("--backend", choices=["fixed", "sim"], default="fixed")
    parser.add_argument("--pacing", default="request",
                        help="how the fixed backend paces stream tokens: request (a timer per stream, so tokens "
                             "reach the router one at a time), step (one clock per server that all its streams "
                             "share, as vLLM's engine steps), or both (request,step; step rows are streams with "
                             "a non-zero latency)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per scenario; the table shows medians")
    parser.add_argument("--quick", action="store_true", help="2 s per run, 100 TTFT requests")
    parser.add_argument("--profile", metavar="DIR", help="write a cProfile of each EPP process to DIR")
    parser.add_argument("--transports", default="lean,aiohttp",
                        help="EPP HTTP stacks to measure side by side: SERVER[+CLIENT], each lean or aiohttp "
                             "(lean: EPP's own server and upstream client; aiohttp+lean: aiohttp's server with "
                             "the lean client; default lean,aiohttp)")
    parser.add_argument("--profiles", default="round-robin,default",
                        help="EPP scheduling profiles to measure (default round-robin,default)")
    parser.add_argument("--tracing", default="off",
                        help="off and/or on (comma-separated): EPP rows without and with OpenTelemetry tracing at "
                             "100%% sampling, exported over OTLP to a sink process")
    parser.add_argument("--floor", action="store_true",
                        help="also measure a TCP byte relay (no HTTP, no routing) on uvloop over the same servers: "
                             "the kernel and event-loop cost any Python proxy pays for the same traffic")
    parser.add_argument("--vllm-router", metavar="CMD",
                        help="also measure vLLM's Rust router (vllm-project/router) over the same 4 servers: CMD is "
                             "its `vllm-router` launcher, e.g. from `pip install vllm-router` in a separate venv")
    parser.add_argument("--production-stack", metavar="CMD",
                        help="also measure vLLM production-stack's Python router over the same 4 servers: CMD "
                             "starts it (`python -m vllm_router.app`), taking its --host/--port/--static-backends "
                             "flags")
    parser.add_argument("--transport", default="lean", help=argparse.SUPPRESS)
    parser.add_argument("--latency", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--profile-name", default="round-robin", help=argparse.SUPPRESS)
    parser.add_argument("--upstreams", default="", help=argparse.SUPPRESS)
    parser.add_argument("--cprofile", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "_backend":
        run_loop(_serve_backend(args))
        return 0
    if args.role == "_epp":
        _run_epp(args)
        return 0
    if args.role == "_otlp":
        run_loop(serve_otlp_sink())
        return 0
    if args.role == "_relay":
        run_loop(serve_relay([int(p) for p in args.upstreams.split(",")]))
        return 0
    if args.quick:
        args.seconds, args.ttft_requests = 2.0, 100
    return _bench(args)


def _bench(args: argparse.Namespace) -> int:
    header = ["backend", "mode", "target", "req/s", "p50 ms", "p99 ms", "router CPU/req ms", "of it kernel ms",
              "added TTFT ms (c=1)"]
    rows: list[list[str]] = []
    for latency, pacing in _backends(args):
        backend = Child("_backend", "--latency", str(latency), "--tokens", str(args.tokens),
                        "--backend", args.backend, "--pacing", pacing)
        direct_url = f"http://127.0.0.1:{backend.info['ports'][0]}/v1/chat/completions"
        label = "CPU-bound" if latency == 0 else f"{latency * 1e3:g} ms" + (", steps" if pacing == "step" else "")
        # Added TTFT is read on per-request pacing: a step-paced first token waits for the server's next step,
        # a jitter as large as what is measured.
        row_args = argparse.Namespace(**{**vars(args), "ttft_requests": 0}) if pacing == "step" else args
        try:
            for stream in ((True,) if pacing == "step" else (False, True)):
                mode = "stream" if stream else "json"
                rows.append(_row(label, mode, "direct (1 server)", run_loop(
                    _measure(direct_url, direct_url, stream, row_args, None))))
                for transport in args.transports.split(","):
                    for profile in args.profiles.split(","):
                        for tracing in args.tracing.split(","):
                            traced = ", tracing 100%" if tracing == "on" else ""
                            rows.append(_row(label, mode, f"EPP {profile}, {transport}{traced} (4 servers)",
                                             _epp_scenario(profile, transport, backend.info["ports"], direct_url,
                                                           stream, row_args,
                                                           f"{label}-{mode}-{profile}-{transport}{traced}",
                                                           tracing)))
                if args.floor:
                    rows.append(_row(label, mode, "floor: TCP byte relay, uvloop (4 servers)",
                                     _relay_scenario(backend.info["ports"], direct_url, stream, row_args)))
                for option, (target, argv_of) in EXTERNAL_ROUTERS.items():
                    if getattr(args, option):
                        rows.append(_row(label, mode, target, _external_scenario(
                            argv_of, getattr(args, option), backend.info["ports"], direct_url, stream, row_args)))
        finally:
            backend.stop()
    print(f"\nconcurrency {args.concurrency}, {args.seconds:g} s per run, median of {args.repeat} run(s), "
          f"{args.tokens} tokens per answer, {args.backend} backend, uvloop everywhere, {os.cpu_count()} CPUs")
    print(table(rows, header))
    return 0


def _backends(args: argparse.Namespace) -> list[tuple[float, str]]:
    """(latency, pacing) of each backend to measure: every latency with per-request pacing, then the
    non-zero latencies with step pacing when asked (streams only: a JSON answer has no tokens to pace)."""
    latencies = [float(x) for x in args.latencies.split(",")]
    pacings = args.pacing.split(",")
    unknown = set(pacings) - {"request", "step"}
    if unknown:
        raise SystemExit(f"--pacing: unknown {', '.join(sorted(unknown))} (request, step)")
    if "step" in pacings and args.backend != "fixed":
        raise SystemExit("--pacing step: only the fixed backend is paced (the simulator has its own steps)")
    out = [(latency, "request") for latency in latencies] if "request" in pacings else []
    if "step" in pacings:
        out += [(latency, "step") for latency in latencies if latency > 0]
    return out


def _epp_scenario(profile: str, transport: str, ports: list[int], direct_url: str, stream: bool,
                  args: argparse.Namespace, name: str, tracing: str = "off") -> Summary:
    extra = []
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        extra = ["--cprofile", str(Path(args.profile).resolve() / f"epp-{name}.prof")]
    sink = Child("_otlp") if tracing == "on" else None
    with environment(otlp_environment(sink.info["port"]) if sink is not None else {}):
        epp = Child("_epp", "--profile-name", profile, "--transport", transport, "--upstreams",
                    ",".join(map(str, ports)), "--tracing", tracing, *extra)
    try:
        return run_loop(_measure(f"http://127.0.0.1:{epp.info['port']}/v1/chat/completions", direct_url,
                                  stream, args, epp.proc.pid))
    finally:
        epp.stop()
        if sink is not None:
            sink.stop()


def _relay_scenario(ports: list[int], direct_url: str, stream: bool, args: argparse.Namespace) -> Summary:
    relay = Child("_relay", "--upstreams", ",".join(map(str, ports)))
    try:
        return run_loop(_measure(f"http://127.0.0.1:{relay.info['port']}/v1/chat/completions", direct_url,
                                  stream, args, relay.proc.pid))
    finally:
        relay.stop()


def _vllm_router_argv(command: str, port: int, ports: list[int]) -> list[str]:
    """vLLM's Rust router (vllm-project/router, ``pip install vllm-router``), round robin."""
    return [command, "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
            "--worker-urls", *(f"http://127.0.0.1:{p}" for p in ports)]


def _production_stack_argv(command: str, port: int, ports: list[int]) -> list[str]:
    """vLLM production-stack's Python router (FastAPI on uvicorn), static discovery, round robin."""
    return [command, "--host", "127.0.0.1", "--port", str(port), "--service-discovery", "static",
            "--static-backends", ",".join(f"http://127.0.0.1:{p}" for p in ports),
            "--static-models", ",".join([MODEL] * len(ports)), "--routing-logic", "roundrobin"]


EXTERNAL_ROUTERS: dict[str, tuple[str, Callable[[str, int, list[int]], list[str]]]] = {
    "vllm_router": ("vllm-router round_robin (Rust, 4 servers)", _vllm_router_argv),
    "production_stack": ("production-stack router roundrobin (Python, 4 servers)", _production_stack_argv),
}
"""Other routers measured beside EPP when their launcher is given (option name: row label, argv builder)."""


def _external_scenario(argv_of: Callable[[str, int, list[int]], list[str]], command: str, ports: list[int],
                       direct_url: str, stream: bool, args: argparse.Namespace) -> Summary:
    """Another router over the same servers, measured like EPP: its process's CPU time (all its threads) per
    request. It must answer ``GET /health`` with 200 once ready."""
    port = free_ports()
    proc = subprocess.Popen(argv_of(command, port, ports), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        run_loop(_wait_ready(url + "/health", proc))
        return run_loop(_measure(url + "/v1/chat/completions", direct_url, stream, args, _cpu_pid(proc.pid)))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _cpu_pid(pid: int) -> int:
    """The process whose CPU is the router's: ``pid``, or, when ``pid`` is a shell script that started the router
    without ``exec``, its only child."""
    try:
        if Path(f"/proc/{pid}/comm").read_text().strip() not in ("bash", "sh", "dash"):
            return pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return pid
    return int(children[0]) if len(children) == 1 else pid


async def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{url}: the router exited with status {proc.returncode}")
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not become ready in {timeout:g} s")


def _row(label: str, mode: str, target: str, s: Summary) -> list[str]:
    row = [label, mode, target, f"{s.rps:.0f}" + (f" ({s.errors} errors)" if s.errors else ""), f"{s.p50:.2f}",
           f"{s.p99:.2f}", "-" if s.cpu_ms is None else f"{s.cpu_ms:.3f}",
           "-" if s.system_ms is None else f"{s.system_ms:.3f}",
           "-" if s.added_ttft_ms is None else f"{s.added_ttft_ms:.2f}"]
    print(*row, sep="  ", flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
