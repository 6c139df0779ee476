"""HTTP server floor: CPU per request of aiohttp's server against a bare ``asyncio.Protocol``, same answer.

Both answer ``POST /v1/chat/completions`` with a fixed ~120-byte JSON body, on uvloop, each in its own process;
the load generator (aiohttp client, ``--concurrency`` keep-alive connections) runs here. The server's CPU time
(user+system, from ``/proc``) divided by the requests answered is what the server itself costs per request before
any gateway work. This is why the gateway has its own HTTP/1.1 server (``epp/gateway/_frontend.py``).

Usage: python -m bench.http_frontends [--seconds S] [--concurrency C] [--repeat N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import aiohttp
from aiohttp import web

from epp.gateway import run

BODY = (b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
        b'"content":"hello world"}}]}')
REQUEST = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


async def _serve_aiohttp(ready: int) -> None:
    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=BODY, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    os.write(ready, str(runner.addresses[0][1]).encode())
    os.close(ready)
    await asyncio.Event().wait()


class _Bare(asyncio.Protocol):
    """Just enough HTTP/1.1 for the load generator: split requests by Content-Length, answer each in a task."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        while (end := buf.find(b"\r\n\r\n")) >= 0:
            length = 0
            for line in buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(buf) < end + 4 + length:
                break
            buf = buf[end + 4 + length:]
            asyncio.get_running_loop().create_task(self.answer())
        self.buf = buf

    async def answer(self) -> None:
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                             % (len(BODY), BODY))


async def _serve_bare(ready: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Bare, "127.0.0.1", 0)
    os.write(ready, str(server.sockets[0].getsockname()[1]).encode())
    os.close(ready)
    await asyncio.Event().wait()


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(port: int, seconds: float, concurrency: int) -> int:
    done = 0
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        stop = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop:
                async with session.post(url, data=REQUEST) as resp:
                    await resp.read()
                    done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def _measure(kind: str, seconds: float, concurrency: int) -> float:
    """µs of server CPU per request for one server kind (``aiohttp`` or ``bare``)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        run(_serve_aiohttp(write) if kind == "aiohttp" else _serve_bare(write))
        os._exit(0)
    os.close(write)
    port = int(os.read(read, 16))
    os.close(read)
    try:
        run(_load(port, 1.0, concurrency))  # warm-up
        before = _cpu(pid)
        count = run(_load(port, seconds, concurrency))
        return (_cpu(pid) - before) / count * 1e6
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_frontends", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {"aiohttp": [], "bare": []}
    for _ in range(args.repeat):  # alternate, so drift in the machine's speed hits both alike
        for kind in results:
            results[kind].append(_measure(kind, args.seconds, args.concurrency))
    for kind, values in results.items():
        print(f"{kind:<8} server CPU per request: median {statistics.median(values):6.1f} µs "
              f"(runs: {', '.join(f'{v:.1f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
