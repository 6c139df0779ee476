"""The round-robin baseline: an HTTP proxy that sends each request to the next server in turn, whatever it asks.

Run as ``python -m bench.routing.rr --port P --upstreams URL,URL,...`` (the benchmark starts it as a child process
and stops it by its PID). Every ``POST`` is forwarded with its body, ``content-type`` and ``x-request-id`` to the next
upstream and the answer is relayed chunk by chunk as it arrives (SSE streams included); ``GET /health`` answers 200.
An upstream that cannot be reached gets the request answered 502, not retried: the baseline has no failover.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from collections.abc import AsyncIterator, Iterator

import aiohttp
from aiohttp import web

__all__ = ["make_app", "main"]

_FORWARDED = ("content-type", "x-request-id")
_UPSTREAMS: web.AppKey[Iterator[str]] = web.AppKey("upstreams")
_SESSION = web.AppKey("session", aiohttp.ClientSession)


def make_app(upstreams: list[str]) -> web.Application:
    """The proxy over ``upstreams`` (base URLs)."""
    app = web.Application(client_max_size=1 << 30)
    app[_UPSTREAMS] = itertools.cycle(upstreams)
    app.cleanup_ctx.append(_client)
    app.router.add_get("/health", _health)
    app.router.add_post("/{path:.*}", _forward)
    return app


async def _client(app: web.Application) -> AsyncIterator[None]:
    # No connection limit and no timeout: the benchmark's client bounds nothing either, so the proxy adds no queue.
    app[_SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                          timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
    yield
    await app[_SESSION].close()


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _forward(request: web.Request) -> web.StreamResponse:
    upstreams = request.app[_UPSTREAMS]
    upstream = next(upstreams)
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED}
    resp = web.StreamResponse()
    try:
        async with request.app[_SESSION].post(upstream + request.path_qs, data=body, headers=headers) as answer:
            resp.set_status(answer.status)
            if "content-type" in answer.headers:
                resp.content_type = answer.content_type
            await resp.prepare(request)
            async for chunk in answer.content.iter_any():
                await resp.write(chunk)
    except aiohttp.ClientConnectionError as exc:
        if not resp.prepared:
            return web.Response(status=502, text=f"{upstream}: {exc}")
        # Mid-answer: end the stream where it broke; the client sees a truncated answer, as from any proxy.
    await resp.write_eof()
    return resp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.routing.rr", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstreams", required=True, help="comma-separated base URLs")
    args = parser.parse_args(argv)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    web.run_app(make_app(args.upstreams.split(",")), host=args.host, port=args.port, access_log=None,
                print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
