"""Gateway hot-path instructions: user-space instructions per proxied request, counted by valgrind's callgrind.

Why this beside ``bench.http_gateway``: CPU time per request on this shared 2-core VM drifts by ±15–40% between
runs and phases, so a change worth a few per cent cannot be seen there. Instruction counts are repeatable for the
same code and inputs (the same figure twice in a row), so this benchmark tells whether a change to the request
path made it cheaper. It does not count the kernel (system calls), which ``http_gateway``'s CPU figure includes.

What runs: ``http_gateway``'s fixed backend (4 servers, 20 ms, ``--tokens`` SSE chunks) and, under ``valgrind
--tool=callgrind --instr-atstart=no``, one ``http_gateway`` EPP process (or its TCP byte relay, the floor). After a
warm-up, instrumentation is switched on for ``--requests`` sequential requests (concurrency 1, so every request
takes the same path and nothing depends on timing), then off; the figure is the instructions counted divided by
the requests.

Usage: ``python -m bench.http_instructions [--requests 200] [--targets round-robin,default,relay]
[--modes json,stream] [--keep DIR]`` (needs ``valgrind`` on PATH; about 20 s per row). ``--keep`` saves each row's
callgrind dumps under ``DIR/<mode>-<target>/`` for ``callgrind_annotate --inclusive=yes`` (where the C-level
cost goes: allocation, exceptions raised and dropped inside builtins, argument parsing).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.gateway_load import add_sequential_options, load, router_args, router_url, run_loop, sequential_rows, table


def _instructions(out_dir: Path) -> int:
    """Sum of the ``totals:`` lines of every callgrind dump in ``out_dir``."""
    total = 0
    for path in out_dir.glob("callgrind.out*"):
        for line in path.read_text().splitlines():
            if line.startswith("totals:"):
                total += int(line.split()[1])
    return total


def measure(target: str, stream: bool, ports: list[int], requests: int, keep: Path | None = None) -> float:
    """Instructions per request of one EPP profile (or ``relay``) under callgrind; the dumps are copied to
    ``keep`` when given."""
    with tempfile.TemporaryDirectory(prefix="epp-callgrind-") as tmp:
        out = Path(tmp)
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out / 'callgrind.out'}",
             sys.executable, "-m", "bench.http_gateway", *router_args(target, ports)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            url = router_url(proc, target)
            run_loop(load(url, stream=stream, concurrency=1, count=30, warmup=2.0))
            _control(proc.pid, "-i", "on")
            done = run_loop(load(url, stream=stream, concurrency=1, count=requests, warmup=0))
            _control(proc.pid, "-i", "off")
            _control(proc.pid, "-d")
            time.sleep(1.0)
        finally:
            proc.terminate()
            proc.wait(60)
        if done.errors or not done.requests:
            raise RuntimeError(f"{target}: {done.errors} errors in {requests} requests")
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for dump in out.glob("callgrind.out*"):
                shutil.copy(dump, keep / dump.name)
        return _instructions(out) / done.requests


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_instructions", description=__doc__.split("\n")[0])
    add_sequential_options(parser, requests=200)
    parser.add_argument("--keep", metavar="DIR", type=Path, help="keep each row's callgrind dumps under DIR")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error("valgrind (with callgrind_control) is not on PATH")

    def cells(target: str, stream: bool, ports: list[int]) -> list[str]:
        keep = args.keep / f"{'stream' if stream else 'json'}-{target}" if args.keep else None
        return [f"{measure(target, stream, ports, args.requests, keep) / 1e3:,.0f} k"]

    rows = sequential_rows(args, cells)
    print(f"\n20 ms backend, {args.tokens} tokens per streamed answer, concurrency 1, {args.requests} requests per "
          f"row, user-space instructions of the router process (valgrind callgrind)")
    print(table(rows, ["mode", "router", "instructions per request"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
