"""Scrape cost: µs per metrics page for each parser, and CPU share of one core for N endpoints at 50 ms.

Run: ``python -m bench.scrape`` (``--quick`` for a short run, ``--endpoints 64 256``, ``--seconds 10``,
``--repeat 3``, ``--parsers targeted "none (HTTP only)" prometheus_client``, ``--transports lean aiohttp``,
``--uvloop`` to run the scrape loop on uvloop, ``--write-v1-page FILE`` to save the generated V1 page).

Pages:

- **V1 (simulator)**: ``GET /metrics`` of a running ``epp_sim`` server after some traffic;
- **V1 (definitions)**: a page built here with ``prometheus_client`` from vLLM V1's metric names, label sets
  (``model_name``, ``engine``) and histogram buckets (``vllm/v1/metrics/loggers.py`` @005a810), every histogram
  observed; this is the full-size V1 page (the simulator exports a subset of the histograms). It is also the
  page the CPU measurement serves;
- **V0**: the real capture ``tests/datalayer/vllm-metrics-v0-sample.txt`` (vLLM ~0.7, aibrix docs).

The CPU measurement starts one HTTP server process (a minimal HTTP/1.1 keep-alive server on uvloop, so it takes
as little of the machine as possible, serving the V1 page on a distinct port per endpoint) and runs EPP's real
:class:`~epp.datalayer.scraper.Scraper` in this process against it for a fixed time; CPU share =
``process_time`` / wall time of the scraping process only. The parse step can be swapped (``--parsers``):
``none`` isolates the HTTP + event-loop cost, ``prometheus_client`` shows the alternative; so
can the HTTP client (``--transports``): EPP's lean keep-alive client or aiohttp's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from epp.datalayer.parsing import BUILTIN_ENGINES, ScanState, parse_targeted, parse_with_prometheus_client
from epp.framework.endpoint import Metrics

V0_CAPTURE = Path(__file__).resolve().parent.parent / "tests" / "datalayer" / "vllm-metrics-v0-sample.txt"
MODEL = "Qwen/Qwen2.5-Coder-1.5B-Instruct"

_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
         80.0, 160.0, 640.0, 2560.0]
_TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
_PREFILL_TOKEN = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0, 7680.0]
_ITER = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def _buckets_1_2_5(max_value: int) -> list[float]:
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** exp
            if v > max_value:
                return out
            out.append(float(v))
        exp += 1


def build_v1_page(engines: int = 1, *, max_model_len: int = 32768, lora: bool = False, seed: int = 0,
                  waiting: tuple[int, ...] = (3, 1), running: tuple[int, ...] = (7, 5),
                  kv: tuple[float, ...] = (0.25, 0.75), legacy_kv_alias: bool = True) -> str:
    """A vLLM V1 ``/metrics`` page as ``PrometheusStatLogger`` renders it, ``engines`` data-parallel engines.

    ``waiting``/``running``/``kv`` give per-engine gauge values (cycled). ``legacy_kv_alias`` also exports the
    deprecated ``vllm:gpu_cache_usage_perc`` mirror, as V1 releases before 0.11 do. Deterministic for a ``seed``.
    """
    rng = random.Random(seed)
    reg = CollectorRegistry()
    lab = ["model_name", "engine"]
    g_run = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", lab, registry=reg)
    g_wait = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", lab, registry=reg)
    g_legacy = (Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use "
                      "vllm:kv_cache_usage_perc instead.", lab, registry=reg) if legacy_kv_alias else None)
    counters = {name: Counter(name, doc, lab, registry=reg) for name, doc in [
        ("vllm:gpu_prefix_cache_queries", "GPU prefix cache queries, in terms of number of queriedtokens. "
                                          "DEPRECATED: Use vllm:prefix_cache_queries instead."),
        ("vllm:gpu_prefix_cache_hits", "GPU prefix cache hits, in terms of number of cached tokens. DEPRECATED: "
                                       "Use vllm:prefix_cache_hits instead."),
    ]}
    g_kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lab, registry=reg)
    for name, doc in [("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
                      ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
                      ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
                      ("vllm:prompt_tokens", "Number of prefill tokens processed."),
                      ("vllm:generation_tokens", "Number of generation tokens processed.")]:
        counters[name] = Counter(name, doc, lab, registry=reg)
    success = Counter("vllm:request_success", "Count of successfully processed requests.", lab + ["finished_reason"],
                      registry=reg)
    tok = _buckets_1_2_5(max_model_len)
    hists = [
        (Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", lab, buckets=tok,
                   registry=reg), lambda: rng.lognormvariate(6, 1.2)),
        (Histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", lab, buckets=tok,
                   registry=reg), lambda: rng.lognormvariate(5, 1)),
        (Histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", lab,
                   buckets=_ITER, registry=reg), lambda: rng.lognormvariate(5, 1.5)),
        (Histogram("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation "
                   "tokens.", lab, buckets=tok, registry=reg), lambda: rng.choice([256, 512, 1024, 4096])),
        (Histogram("vllm:request_params_n", "Histogram of the n request parameter.", lab, buckets=[1, 2, 5, 10, 20],
                   registry=reg), lambda: 1),
        (Histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", lab,
                   buckets=tok, registry=reg), lambda: rng.choice([256, 512, 1024, 4096])),
        (Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lab,
                   buckets=_TTFT, registry=reg), lambda: rng.lognormvariate(-2, 1)),
        (Histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", lab,
                   buckets=_TPOT, registry=reg), lambda: rng.lognormvariate(-3.5, 0.5)),
        (Histogram("vllm:time_per_prefill_token_request_seconds", "Time spent per token during prefill  phase in "
                   "seconds", lab, buckets=_PREFILL_TOKEN, registry=reg), lambda: rng.lognormvariate(-7, 1)),
    ]
    for name, doc in [("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
                      ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
                      ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for "
                                                              "request."),
                      ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
                      ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.")]:
        hists.append((Histogram(name, doc, lab, buckets=_LATENCY, registry=reg), lambda: rng.lognormvariate(1, 1)))
    info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                 ["block_size", "cache_dtype", "calculate_kv_scales", "cpu_offload_gb", "enable_prefix_caching",
                  "gpu_memory_utilization", "is_attention_free", "num_cpu_blocks", "num_gpu_blocks",
                  "num_gpu_blocks_override", "prefix_caching_hash_algo", "sliding_window", "swap_space",
                  "swap_space_bytes", "engine"], registry=reg)
    for e in range(engines):
        labels = (MODEL, str(e))
        g_run.labels(*labels).set(running[e % len(running)])
        g_wait.labels(*labels).set(waiting[e % len(waiting)])
        g_kv.labels(*labels).set(kv[e % len(kv)])
        if g_legacy is not None:
            g_legacy.labels(*labels).set(kv[e % len(kv)])
        for c in counters.values():
            c.labels(*labels).inc(rng.randint(1000, 10 ** 7))
        for reason in ("stop", "length", "abort"):
            success.labels(*labels, reason).inc(rng.randint(0, 10 ** 5))
        for hist, sample in hists:
            child = hist.labels(*labels)
            for _ in range(200):
                child.observe(sample())
        info.labels("16", "auto", "False", "0", "True", "0.9", "False", "9362", "81767", "None", "builtin", "None",
                    "4", "4294967296", str(e)).set(1)
    if lora:
        g_lora = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                       ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=reg)
        g_lora.labels("4", "", "sql-lora").set(1738217300.0)
        g_lora.labels("4", "chat-lora", "sql-lora,fr-lora").set(1738217335.8)
    return generate_latest(reg).decode()


def v1_page_from_simulator(requests: int = 32) -> str:
    """``GET /metrics`` from a running simulator (``epp_sim``) after ``requests`` completions went through it,
    so its histograms carry values. The simulator renders vLLM V1's exposition (``engine`` and ``model_name``
    labels) but only a subset of V1's histograms, so its page is smaller than a real one."""
    import aiohttp

    from epp_sim.config import SimConfig
    from epp_sim.server import SimServer

    async def fetch() -> str:
        sim = SimServer(SimConfig(model=MODEL, num_gpu_blocks=81767, time_scale=0.01))
        await sim.start()
        try:
            async with aiohttp.ClientSession() as s:
                async def one(i: int) -> None:
                    body = {"model": MODEL, "prompt": f"request {i} " * (i + 1), "max_tokens": 8 + i}
                    async with s.post(f"{sim.url}/v1/completions", json=body) as r:
                        await r.read()

                await asyncio.gather(*(one(i) for i in range(requests)))
                async with s.get(f"{sim.url}/metrics") as r:
                    return await r.text()
        finally:
            await sim.stop()

    return asyncio.run(fetch())


def per_page_us(fn: Callable[[], object], min_seconds: float = 1.0) -> float:
    """Median over 5 rounds of the mean µs per call, each round lasting about ``min_seconds / 5``."""
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.05:
        fn()
        n += 1
    per_round = max(1, int(n * min_seconds / 5 / 0.05))
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(per_round):
            fn()
        rounds.append((time.perf_counter() - t0) / per_round * 1e6)
    return sorted(rounds)[2]


def parser_table(pages: dict[str, str], seconds: float) -> list[tuple[str, int, float, float, float]]:
    """(page, bytes, µs prometheus_client, µs targeted, µs targeted with a warm per-endpoint ScanState) per
    page; all three must agree before anything is timed."""
    vllm = BUILTIN_ENGINES["vllm"]
    rows = []
    for name, text in pages.items():
        body, state = text.encode(), ScanState()
        results = (parse_with_prometheus_client(text, vllm, 1.0), parse_targeted(body, vllm, 1.0),
                   parse_targeted(body, vllm, 1.0, state))
        if results.count(results[0]) != 3:
            raise SystemExit(f"parsers disagree on {name}: {results}")
        full = per_page_us(lambda: parse_with_prometheus_client(text, vllm), seconds)
        targeted = per_page_us(lambda: parse_targeted(body, vllm), seconds)
        warm = per_page_us(lambda: parse_targeted(body, vllm, None, state), seconds)
        rows.append((name, len(body), full, targeted, warm))
    return rows


# --------------------------------------------------------------------------------------------------------------
# CPU share of the scrape loop against a real HTTP server


_SERVER = r"""
# A minimal HTTP/1.1 keep-alive server answering every request with the same metrics page. Deliberately cheap
# (no framework): on a small machine the server process competes with the scraper for the same cores.
import asyncio, sys
page = open(sys.argv[1], "rb").read()
n = int(sys.argv[2])
response = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            b"Content-Length: %d\r\n\r\n" % len(page)) + page

class Metrics(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buf = transport, b""
    def data_received(self, data):
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            _, self.buf = self.buf.split(b"\r\n\r\n", 1)
            self.transport.write(response)

async def main():
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(Metrics, "127.0.0.1", 0) for _ in range(n)]
    print(" ".join(str(s.sockets[0].getsockname()[1]) for s in servers), flush=True)
    await asyncio.Event().wait()
try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""


_PARSERS: dict[str, Callable[..., Metrics]] = {
    "targeted": parse_targeted,
    "prometheus_client": lambda body, cfg, now, state=None: parse_with_prometheus_client(body.decode(), cfg, now),
    "none (HTTP only)": lambda body, cfg, now, state=None: Metrics(update_time=now or time.monotonic()),
}


async def _cpu_share(ports: list[int], seconds: float, interval: float, parser: str,
                     transport: str) -> tuple[float, int, int]:
    from epp.datalayer import scraper as scraper_module
    from epp.datalayer.datastore import Datastore
    from epp.framework.endpoint import EndpointSpec

    # The scraper calls the module-level parse function; swap it to measure the alternatives in the same loop.
    scraper_module.parse_targeted = _PARSERS[parser]  # type: ignore[assignment]
    try:
        ds = Datastore()
        config = scraper_module.ScrapeConfig(interval=interval, timeout=1.0, transport=transport)
        scraper = scraper_module.Scraper(ds, config)
        await scraper.start()
        ds.replace_all(EndpointSpec(f"ep-{i}", "127.0.0.1", p) for i, p in enumerate(ports))
        await asyncio.sleep(1.0)  # connections established, loops spread by their start jitter
        before = scraper.stats.snapshot()
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        after = scraper.stats.snapshot()
        await scraper.stop()
    finally:
        scraper_module.parse_targeted = parse_targeted  # type: ignore[assignment]
    return cpu / wall, round((after[0] - before[0]) / wall), after[1] - before[1]


def cpu_table(page: str, counts: list[int], parsers: list[str], transports: list[str], seconds: float,
              interval: float, use_uvloop: bool, repeat: int) -> list[tuple[int, str, str, float, int, int]]:
    """(endpoints, transport, parser, CPU share of one core, scrapes/s, failures) per endpoint count, transport
    and parser; the median of ``repeat`` runs (by CPU share)."""
    import tempfile

    rows = []
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(page)
    try:
        for n in counts:
            proc = subprocess.Popen([sys.executable, "-c", _SERVER, f.name, str(n)], stdout=subprocess.PIPE,
                                    text=True)
            try:
                assert proc.stdout is not None
                ports = [int(p) for p in proc.stdout.readline().split()]
                for transport in transports:
                    for parser in parsers:
                        runs = sorted(_runner(use_uvloop)(_cpu_share(ports, seconds, interval, parser, transport))
                                      for _ in range(repeat))
                        share, rate, failed = runs[len(runs) // 2]
                        rows.append((n, transport, parser, share, rate, failed))
            finally:
                proc.terminate()
                proc.wait()
    finally:
        os.unlink(f.name)
    return rows


def _runner(use_uvloop: bool) -> Callable:  # type: ignore[type-arg]
    if use_uvloop:
        import uvloop

        return uvloop.run
    return asyncio.run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--endpoints", type=int, nargs="*", default=[64, 256])
    ap.add_argument("--seconds", type=float, default=10.0, help="CPU measurement window per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per row; the median is reported")
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--parsers", nargs="*", default=["targeted", "none (HTTP only)"], choices=list(_PARSERS),
                    help="parse step in the CPU runs ('none' isolates HTTP + loop cost)")
    ap.add_argument("--transports", nargs="*", default=["lean", "aiohttp"], choices=["lean", "aiohttp"],
                    help="HTTP client of the scraper")
    ap.add_argument("--uvloop", action="store_true", help="run the scraping process on uvloop")
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    ap.add_argument("--write-v1-page", metavar="FILE", help="write the generated V1 page (DP=2) and exit")
    args = ap.parse_args(argv)
    if args.write_v1_page:
        Path(args.write_v1_page).write_text(build_v1_page(engines=2, lora=False))
        return
    seconds, repeat = (1.0, 1) if args.quick else (args.seconds, args.repeat)
    print(f"host: {os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}, Python "
          f"{sys.version.split()[0]}\n")
    pages = {"V1 (simulator /metrics)": v1_page_from_simulator(),
             "V1 (vLLM V1 definitions, 1 engine)": build_v1_page(engines=1),
             "V1 (vLLM V1 definitions, DP=4 engines)": build_v1_page(engines=4),
             "V0 (real capture)": V0_CAPTURE.read_text()}
    print("| page | bytes | prometheus_client µs/page | targeted µs/page | targeted + scan state µs/page "
          "| speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, size, full, targeted, warm in parser_table(pages, 0.5 if args.quick else 2.0):
        print(f"| {name} | {size} | {full:.0f} | {targeted:.1f} | {warm:.1f} | {full / warm:.0f}x |")
    loop_name = "uvloop" if args.uvloop else "asyncio"
    print(f"\nCPU share of one core, scraping a {len(pages['V1 (vLLM V1 definitions, 1 engine)'])}-byte V1 page "
          f"every {args.interval * 1000:.0f} ms per endpoint ({loop_name}, median of {repeat} x {seconds:.0f} s):\n")
    print("| endpoints | HTTP client | parse step | CPU share of one core | scrapes/s (target) | CPU µs per scrape "
          "| failures |")
    print("|---:|---|---|---:|---:|---:|---:|")
    rows = cpu_table(build_v1_page(engines=1), args.endpoints, args.parsers, args.transports, seconds,
                     args.interval, args.uvloop, repeat)
    for n, transport, parser, share, rate, failed in rows:
        target = round(n / args.interval)
        per_scrape = share / rate * 1e6 if rate else float("nan")
        print(f"| {n} | {transport} | {parser} | {share * 100:.1f}% | {rate} ({target}) | {per_scrape:.0f} "
              f"| {failed} |")


if __name__ == "__main__":
    main()
