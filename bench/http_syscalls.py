"""Gateway system calls per proxied request, counted by ``strace -c``, beside the TCP byte relay's.

Why: ``bench.http_gateway``'s CPU figure mixes the kernel's share (a ``read``, a ``write`` and an ``epoll_pwait``
per relayed read) with the router's own; ``bench.http_instructions`` counts only user space. This benchmark
counts the kernel entries, so it tells whether EPP asks the kernel for more than a bare relay does (extra writes,
timers, ``epoll_ctl`` churn) or whether the difference is all user-space work.

What runs: ``http_gateway``'s fixed backend (4 servers, 20 ms, ``--tokens`` SSE chunks) and one ``http_gateway``
EPP process (or its TCP byte relay). After a warm-up, ``strace -c -f`` is attached for ``--requests`` sequential
requests (concurrency 1, so every request takes the same path), then detached; the figures are the calls of
each kind divided by the requests.

Usage: ``python -m bench.http_syscalls [--requests 300] [--targets round-robin,default,relay]
[--modes json,stream]`` (needs ``strace`` on PATH and permission to attach to a child; about 10 s per row).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.gateway_load import add_sequential_options, load, router_args, router_url, run_loop, sequential_rows, table

_MAIN_CALLS = ("read", "write", "epoll_pwait", "epoll_ctl")
"""The calls a relayed read costs, shown in their own columns."""


def parse_strace_summary(text: str) -> dict[str, int]:
    """Calls per system call name from ``strace -c`` output (the ``total`` line excluded)."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        # "% time  seconds  usecs/call  calls  [errors]  syscall": calls is the 4th column
        if len(parts) >= 5 and parts[3].isdigit() and parts[-1] != "total":
            calls[parts[-1]] = int(parts[3])
    return calls


def measure(target: str, stream: bool, ports: list[int], requests: int) -> dict[str, float]:
    """System calls per request by name of one EPP profile (or ``relay``)."""
    proc = subprocess.Popen([sys.executable, "-m", "bench.http_gateway", *router_args(target, ports)],
                            stdout=subprocess.PIPE, text=True)
    try:
        url = router_url(proc, target)
        run_loop(load(url, stream=stream, concurrency=1, count=30, warmup=1.0))
        with tempfile.TemporaryDirectory(prefix="epp-strace-") as tmp:
            out = Path(tmp) / "summary.txt"
            tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(proc.pid), "-o", str(out)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # attached to every thread before the first measured request
            done = run_loop(load(url, stream=stream, concurrency=1, count=requests, warmup=0))
            tracer.send_signal(signal.SIGINT)
            tracer.wait(30)
            summary = out.read_text()
    finally:
        proc.terminate()
        proc.wait(30)
    if done.errors or not done.requests:
        raise RuntimeError(f"{target}: {done.errors} errors in {requests} requests")
    calls = parse_strace_summary(summary)
    if not calls:
        raise RuntimeError(f"{target}: strace reported nothing (is attaching to a child allowed here?)")
    return {name: n / done.requests for name, n in calls.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_syscalls", description=__doc__.split("\n")[0])
    add_sequential_options(parser, requests=300)
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        parser.error("strace is not on PATH")

    def cells(target: str, stream: bool, ports: list[int]) -> list[str]:
        per_request = measure(target, stream, ports, args.requests)
        main_calls = [per_request.get(k, 0.0) for k in _MAIN_CALLS]
        other = sum(v for k, v in per_request.items() if k not in _MAIN_CALLS)
        return [*(f"{v:.2f}" for v in main_calls), f"{other:.2f}", f"{sum(per_request.values()):.2f}"]

    rows = sequential_rows(args, cells)
    print(f"\n20 ms backend, {args.tokens} tokens per streamed answer, concurrency 1, {args.requests} requests per "
          f"row, system calls per request of the router process (strace -c -f)")
    print(table(rows, ["mode", "router", *_MAIN_CALLS, "other", "total"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
