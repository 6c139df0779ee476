"""The process roles of :mod:`bench.extproc` (each started as ``python -m bench.extproc <role>``): the
vLLM-shaped upstreams, EPP (or the trivial grpc.aio picker) and the closed-loop HTTP/1.1 load generator, which
prints its results as one JSON line."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import time
from typing import Any

MODEL = "m"

# -- upstreams ----------------------------------------------------------------------------------------------

def _metrics_page() -> bytes:
    from epp_sim import SimConfig, SimServer

    server = SimServer(SimConfig(model=MODEL))
    return server.metrics.render(server.engine)


_COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1000, "completion_tokens": 1, "total_tokens": 1001},
}).encode()


class _Upstream(asyncio.Protocol):
    """Minimal HTTP/1.1 server: Content-Length or chunked request bodies, keep-alive, canned answers."""

    page = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            rest = end + 4
            if b"transfer-encoding: chunked" in head:
                done = self.buf.find(b"\r\n0\r\n\r\n", rest - 2)
                if done < 0:
                    return
                consumed = done + 7
            else:
                at = head.find(b"content-length:")
                length = int(head[at + 15:head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0 else None]) \
                    if at >= 0 else 0
                if len(self.buf) < rest + length:
                    return
                consumed = rest + length
            self.buf = self.buf[consumed:]
            if head.startswith(b"get /metrics"):
                body, ctype = self.page, b"text/plain; version=0.0.4"
            else:
                body, ctype = _COMPLETION, b"application/json"
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\ncontent-length: "  # type: ignore[attr-defined]
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)


async def serve_upstreams(n: int) -> None:
    _Upstream.page = _metrics_page()
    loop = asyncio.get_running_loop()
    ports = []
    for _ in range(n):
        server = await loop.create_server(_Upstream, "127.0.0.1", 0, backlog=1024)
        ports.append(server.sockets[0].getsockname()[1])
    print(json.dumps(ports), flush=True)
    await asyncio.Event().wait()


# -- EPP ----------------------------------------------------------------------------------------------------

async def _serve_epp(port: int, ports: list[int], config: str | None, mode: str, worker: tuple[int, int, str] | None,
                     refresh: float | None, transport: str) -> None:
    from epp.config.loader import DataLayerSpec
    from epp.framework.endpoint import EndpointSpec
    from epp.runtime.app import EppApp, ServeOptions
    from epp.runtime.workers import PeerLink

    specs = [EndpointSpec(name=f"ep{i}", address="127.0.0.1", port=p) for i, p in enumerate(ports)]
    app = EppApp(ServeOptions(config=config, endpoints=specs, host="127.0.0.1", grpc_port=port, health_port=None,
                              metrics_port=None, plaintext=True, extproc_mode=mode, refresh_interval=refresh,
                              extproc_transport=transport))
    link = None
    if worker is not None and worker[0] != 0:
        app.pipeline.config.data_layer = DataLayerSpec(sources=[])  # worker 0 scrapes for everyone
    await app.start()
    if worker is not None:
        link = PeerLink(worker[0], worker[1], worker[2])
        link.attach(app.director)
        await link.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(f"READY {app.extproc.port}", flush=True)
    await stop.wait()
    if link is not None:
        await link.stop()
    await app.stop()


async def _serve_trivial(port: int, ports: list[int]) -> None:
    """The baseline: a round-robin picker that parses ``model`` and nothing else (same stubs, same protocol)."""
    import grpc
    import orjson

    from epp.extproc.protocol import (
        CONTINUE_REQUEST_HEADERS,
        CONTINUE_RESPONSE_BODY,
        CONTINUE_RESPONSE_HEADERS,
        SERVICE_NAME,
        BodySendMode,
        pb,
        routing_metadata,
        routing_mutation,
        serialize,
        streamed_body,
    )

    targets = [f"127.0.0.1:{p}" for p in ports]
    counter = iter(range(1 << 62))

    async def process(requests, context):  # type: ignore[no-untyped-def]
        parts: list[bytes] = []
        duplex = True
        async for req in requests:
            kind = req.WhichOneof("request")
            if kind == "request_headers":
                duplex = req.protocol_config.request_body_mode == BodySendMode.FULL_DUPLEX_STREAMED
                if req.request_headers.end_of_stream or not duplex:
                    yield CONTINUE_REQUEST_HEADERS
            elif kind == "request_body":
                parts.append(req.request_body.body)
                if req.request_body.end_of_stream:
                    body = b"".join(parts)
                    orjson.loads(body)["model"]
                    target = targets[next(counter) % len(targets)]
                    reply = pb.ProcessingResponse()
                    common = reply.request_headers.response if duplex else reply.request_body.response
                    routing_mutation(common, target, {"content-length": str(len(body))} if duplex else {}, {})
                    routing_metadata(reply, target, target)
                    yield reply
                    if duplex:
                        for chunk in streamed_body(body, request=True, end_of_stream=True):
                            yield chunk
            elif kind == "response_headers":
                yield CONTINUE_RESPONSE_HEADERS
            elif kind == "response_body":
                yield CONTINUE_RESPONSE_BODY

    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(process, request_deserializer=pb.ProcessingRequest.FromString,
                                                    response_serializer=serialize)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE_NAME, {"Process": handler})])
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(f"READY {bound}", flush=True)
    await stop.wait()
    await server.stop(0)


def run_epp(args: argparse.Namespace) -> None:
    if args.uvloop:
        import uvloop

        uvloop.install()
    if args.trivial:
        coro = _serve_trivial(args.port, json.loads(args.ports))
    else:
        worker = (args.worker_index, args.workers, args.link_dir) if args.link_dir else None
        coro = _serve_epp(args.port, json.loads(args.ports), args.config, args.mode, worker, args.refresh_interval,
                         args.transport)
    if not args.profile:
        asyncio.run(coro)
        return
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    try:
        asyncio.run(coro)
    finally:
        prof.disable()
        prof.dump_stats(args.profile)


# -- load generator -----------------------------------------------------------------------------------------

def _bodies(size: int, count: int = 256) -> list[bytes]:
    rng = random.Random(7)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
    out = []
    for i in range(count):
        text = f"[{i}] " + " ".join(rng.choice(words) for _ in range(size // 6))
        body = {"model": MODEL, "messages": [{"role": "system", "content": "You are helpful."},
                                             {"role": "user", "content": text}], "max_tokens": 16}
        out.append(json.dumps(body).encode())
    return out


async def _client(host: str, port: int, requests: list[bytes], lat: list[float], state: dict[str, Any]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    i = random.randrange(len(requests))
    perf = time.perf_counter
    try:
        while not state["stop"]:
            req = requests[i % len(requests)]
            i += 1
            t0 = perf()
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head[9:12]
            low = head.lower()
            at = low.find(b"content-length:")
            if at >= 0:
                await reader.readexactly(int(low[at + 15:low.find(b"\r\n", at)]))
            else:
                while True:  # chunked
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    await reader.readexactly(size + 2)
                    if size == 0:
                        break
            if state["measuring"]:
                if status == b"200":
                    lat.append(perf() - t0)
                else:
                    state["errors"] += 1
    finally:
        writer.close()


async def _load(host: str, port: int, concurrency: int, warmup: float, duration: float, body_kb: int) -> None:
    bodies = _bodies(body_kb * 1024)
    requests = [b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(b)).encode() + b"\r\n\r\n" + b for b in bodies]
    lat: list[float] = []
    state: dict[str, Any] = {"stop": False, "measuring": False, "errors": 0}
    tasks = [asyncio.create_task(_client(host, port, requests, lat, state)) for _ in range(concurrency)]
    await asyncio.sleep(warmup)
    state["measuring"] = True
    print("MEASURING", flush=True)
    t0 = time.perf_counter()
    await asyncio.sleep(duration)
    state["measuring"] = False
    window = time.perf_counter() - t0
    print("DONE", flush=True)
    state["stop"] = True
    await asyncio.wait(tasks, timeout=10)
    lat.sort()
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3 if lat else float("nan"))
    print(json.dumps({"requests": len(lat), "errors": state["errors"], "window": window,
                      "p50_ms": pct(0.50), "p99_ms": pct(0.99)}), flush=True)


def run_load(args: argparse.Namespace) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_load("127.0.0.1", args.port, args.concurrency, args.warmup, args.duration, args.body_kb))
