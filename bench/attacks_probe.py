"""The well-behaved client of :mod:`bench.attacks`, run in its own process (``python -m bench.attacks _probe``).

A closed loop of valid requests on one connection: ``extproc``, a full ext_proc call through a ``grpc.aio``
channel (request headers and body in full-duplex mode, the routing reply, response headers and body, then the rest
of EPP's replies); ``gateway``, ``POST /v1/chat/completions`` through aiohttp. It prints ``READY`` after its first
successful request (retrying for up to 30 s), keeps going until a line ``STOP`` (or EOF) on stdin or
``max_seconds``, and prints one JSON line: ``[[start, end, ok], ...]`` on the ``time.monotonic()`` clock, which
is system-wide, so the orchestrator cuts the quiet and attack windows from its own timestamps. A request taking
longer than ``timeout`` counts as failed at that time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable

__all__ = ["add_arguments", "run"]

Sample = tuple[float, float, bool]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=("extproc", "gateway"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--timeout", type=float, default=5.0)


def run(args: argparse.Namespace) -> None:
    """The probe's process: the loop, then the samples on stdout."""
    samples = asyncio.run(_main(args))
    print(json.dumps(samples), flush=True)


async def _main(args: argparse.Namespace) -> list[Sample]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.call_later(args.max_seconds, stop.set)
    opener = _ExtprocProbe if args.kind == "extproc" else _GatewayProbe
    async with opener("127.0.0.1", args.port) as one:
        await _warm(one, args.timeout)
        print("READY", flush=True)
        watcher = loop.run_in_executor(None, _wait_stop)
        watcher.add_done_callback(lambda _: stop.set())
        return await _loop(one, stop, args.timeout)


def _wait_stop() -> None:
    for line in sys.stdin:
        if line.strip() == "STOP":
            return


async def _warm(one: Callable[[], Awaitable[bool]], timeout: float) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if await asyncio.wait_for(one(), timeout):
                return
        except Exception:  # noqa: BLE001 -- EPP may still be starting: any failure is retried
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("the probe got no successful answer in 30 s")


async def _loop(one: Callable[[], Awaitable[bool]], stop: asyncio.Event, timeout: float) -> list[Sample]:
    samples: list[Sample] = []
    while not stop.is_set():
        start = time.monotonic()
        try:
            ok = await asyncio.wait_for(one(), timeout)
        except Exception:  # noqa: BLE001 -- any failure (reset, timeout, bad answer) is the sample's verdict
            ok = False
        samples.append((start, time.monotonic(), ok))
        if not ok:
            await asyncio.sleep(0.01)  # a refused connection fails at once: do not spin
    return samples


class _ExtprocProbe:
    """An async context giving one full ext_proc call per await, on one grpc.aio channel."""

    def __init__(self, host: str, port: int) -> None:
        import grpc

        from epp.extproc.protocol import METHOD_PATH, pb

        self.channel = grpc.aio.insecure_channel(f"{host}:{port}")
        self.method = self.channel.stream_stream(METHOD_PATH, request_serializer=pb.ProcessingRequest.SerializeToString,
                                                 response_deserializer=pb.ProcessingResponse.FromString)
        self.request, self.response = extproc_messages()
        self.eof = grpc.aio.EOF

    async def __aenter__(self) -> Callable[[], Awaitable[bool]]:
        return self.call

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()

    async def call(self) -> bool:
        call = self.method()
        try:
            for msg in self.request:
                await call.write(msg)
            routed = await call.read()
            if routed is self.eof or not routed.HasField("request_headers"):
                return False
            for msg in self.response:
                await call.write(msg)
            await call.done_writing()
            while await call.read() is not self.eof:
                pass
            return True
        finally:
            call.cancel()


def extproc_messages() -> tuple[list[object], list[object]]:
    """The messages Envoy sends for one small chat request in full-duplex mode: request side, response side."""
    from epp._pb.envoy.config.core.v3 import base_pb2
    from epp.extproc.protocol import BodySendMode, pb

    def headers(fields: dict[str, str]) -> base_pb2.HeaderMap:
        hm = base_pb2.HeaderMap()
        for k, v in fields.items():
            hm.headers.add(key=k, raw_value=v.encode())
        return hm

    head = pb.ProcessingRequest()
    head.request_headers.headers.CopyFrom(headers({":method": "POST", ":path": "/v1/chat/completions",
                                                   ":authority": "gw", "content-type": "application/json"}))
    head.protocol_config.request_body_mode = BodySendMode.FULL_DUPLEX_STREAMED
    head.protocol_config.response_body_mode = BodySendMode.FULL_DUPLEX_STREAMED
    body = pb.ProcessingRequest()
    body.request_body.body = _chat_body()
    body.request_body.end_of_stream = True
    answer = pb.ProcessingRequest()
    answer.response_headers.headers.CopyFrom(headers({":status": "200", "content-type": "application/json"}))
    answer_body = pb.ProcessingRequest()
    answer_body.response_body.body = (b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":'
                                      b'{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":5,'
                                      b'"completion_tokens":1,"total_tokens":6}}')
    answer_body.response_body.end_of_stream = True
    return [head, body], [answer, answer_body]


def _chat_body() -> bytes:
    from bench.gateway_load import request_body

    return request_body(0, stream=False)


class _GatewayProbe:
    """An async context giving one chat completion per await, on one keep-alive connection."""

    def __init__(self, host: str, port: int) -> None:
        self.url = f"http://{host}:{port}/v1/chat/completions"
        self.body = _chat_body()

    async def __aenter__(self) -> Callable[[], Awaitable[bool]]:
        import aiohttp

        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
        return self.call

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()

    async def call(self) -> bool:
        from bench.gateway_load import one_request

        await one_request(self.session, self.url, self.body, stream=False)  # raises on a status other than 200
        return True
