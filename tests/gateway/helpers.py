"""Helpers for the gateway tests: simulated model servers, a Director over them, the gateway on port 0.

Everything is real I/O on 127.0.0.1: the simulator (``epp_sim``) plays vLLM, the gateway is served by
:class:`epp.gateway.GatewayServer`, clients are the official ``openai`` and ``anthropic`` packages or aiohttp. Two
seams we own are faked: :class:`Recorder` (a ResponseComplete hook that keeps what the gateway reported) and
:class:`Tap` (a recording relay in front of a simulated server, to see the exact bodies the gateway sent).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, ClassVar

import aiohttp
import anthropic
import openai
import orjson
from aiohttp import web

from epp.datalayer.datastore import Datastore
from epp.framework.endpoint import ROLE_LABEL, Endpoint, EndpointSpec
from epp.framework.plugins import ResponseInfo
from epp.framework.request import InferenceRequest
from epp.gateway import GatewayServer
from epp.scheduling.director import Director
from epp_sim import SimConfig, SimServer

MODEL = "sim-model"

RANDOM_CONFIG = """\
plugins:
- type: random-picker
  parameters: {maxNumOfEndpoints: %d}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
"""

PD_CONFIG = """\
plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: max-score-picker
%(decider)s
- type: disagg-profile-handler
  parameters:
    deciders: {prefill: decider}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"""
ALWAYS_DISAGG = "- type: always-disagg-pd-decider\n  name: decider"
NEVER_DISAGG = "- type: prefix-based-pd-decider\n  name: decider\n  parameters: {nonCachedTokens: 1000000}"


def random_config(fallbacks: int = 1) -> str:
    """A profile with only ``random-picker`` returning ``fallbacks`` endpoints (target + fallbacks)."""
    return RANDOM_CONFIG % fallbacks


class Recorder:
    """ResponseComplete hook: what the gateway reported for each finished request, in order."""

    type_name: ClassVar[str] = "test-recorder"

    def __init__(self) -> None:
        self.name = "recorder"
        self.done: list[tuple[InferenceRequest, Endpoint | None, ResponseInfo]] = []

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, info: ResponseInfo) -> None:
        self.done.append((request, endpoint, info))

    @property
    def infos(self) -> list[ResponseInfo]:
        return [info for _, _, info in self.done]


@dataclass
class TapRecord:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int = 0
    answer: Any = None


class Tap:
    """A relay in front of one model server that records every request body and (non-stream) answer."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.records: list[TapRecord] = []
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._session = aiohttp.ClientSession()
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        rec = TapRecord(request.path, {k.lower(): v for k, v in request.headers.items()},
                        orjson.loads(raw) if raw else {})
        self.records.append(rec)
        assert self._session is not None
        async with self._session.request(request.method, self.target + request.path_qs, data=raw,
                                         headers={k: v for k, v in request.headers.items()
                                                  if k.lower() not in ("host", "content-length", "transfer-encoding")}) as up:
            rec.status = up.status
            if "text/event-stream" not in up.headers.get("Content-Type", ""):
                data = await up.read()
                rec.answer = orjson.loads(data) if data else None
                return web.Response(status=up.status, body=data, content_type=up.content_type)
            out = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out


class TcpRelay:
    """A TCP relay in front of a server. :attr:`open` counts connections from the gateway still open;
    :meth:`kill` makes the endpoint die like a crashed process (listener closed, connections reset)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.killed = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._open = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def open(self) -> int:
        return self._open

    def kill(self) -> None:
        self.killed = True
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()

    async def stop(self) -> None:
        self.kill()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self._open += 1
        up_writer: asyncio.StreamWriter | None = None
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._writers.add(up_writer)
            if self.killed:
                writer.transport.abort()
                up_writer.transport.abort()
                return
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._open -= 1
            self._writers.discard(writer)
            if up_writer is not None:
                self._writers.discard(up_writer)
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


def spec_for(server: SimServer, name: str | None = None, port: int | None = None) -> EndpointSpec:
    """The endpoint spec of a simulated server (its role as the ``llm-d.ai/role`` label)."""
    return EndpointSpec(name=name or f"sim-{server.port}", address="127.0.0.1", port=port or server.port,
                        labels={ROLE_LABEL: server.cfg.role})


def dead_spec(name: str = "dead") -> EndpointSpec:
    """An endpoint nobody listens on (connections are refused)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return EndpointSpec(name=name, address="127.0.0.1", port=port)


@dataclass
class Stack:
    """A running gateway and what it runs on."""

    director: Director
    datastore: Datastore
    server: GatewayServer
    recorder: Recorder
    session: aiohttp.ClientSession
    extra: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def openai(self, **kw: Any) -> openai.AsyncOpenAI:
        """An official OpenAI client pointed at the gateway (no client-side retries)."""
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="test-key", max_retries=0, **kw)

    def anthropic(self, **kw: Any) -> anthropic.AsyncAnthropic:
        """An official Anthropic client pointed at the gateway (``/v1/messages``; no client-side retries)."""
        return anthropic.AsyncAnthropic(base_url=self.url, api_key="test-key", max_retries=0, **kw)

    async def post(self, path: str, body: Any, **kw: Any) -> tuple[int, Any]:
        """POST JSON (or raw bytes); returns (status, decoded JSON or text)."""
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        async with self.session.post(self.url + path, data=data, **kw) as resp:
            raw = await resp.read()
            try:
                return resp.status, orjson.loads(raw)
            except orjson.JSONDecodeError:
                return resp.status, raw.decode(errors="replace")

    async def get(self, path: str) -> tuple[int, Any]:
        """GET ``path``; returns (status, decoded JSON or text)."""
        async with self.session.get(self.url + path) as resp:
            raw = await resp.read()
            try:
                return resp.status, orjson.loads(raw)
            except orjson.JSONDecodeError:
                return resp.status, raw.decode(errors="replace")

    def inflight(self) -> int:
        return sum(ep.inflight_requests for ep in self.datastore.endpoints())


StackFactory = Callable[..., Awaitable[Stack]]


def sim(**kw: Any) -> SimConfig:
    """A fast simulated server (time runs 100x faster than the modelled H100)."""
    kw.setdefault("model", MODEL)
    kw.setdefault("time_scale", 0.01)
    return SimConfig(**kw)


def chat(content: str = "Hello there, how are you?", **kw: Any) -> dict[str, Any]:
    """A chat completions request body."""
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}


class RawServer:
    """Answers each request (head and Content-Length body) with ``answer``, written ``step`` bytes at a time
    (or, for a list, one write per item with a pause after each, so each usually arrives as one read);
    counts connections and requests; ``close_after`` closes the connection after the answer."""

    def __init__(self, answer: bytes | list[bytes], *, step: int = 0, close_after: bool = False,
                 delay: float = 0.0) -> None:
        self.answer = answer
        self.step = step
        self.close_after = close_after
        self.delay = delay
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Endpoint:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return Endpoint(EndpointSpec("raw", "127.0.0.1", port))

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    def _parts(self) -> list[bytes]:
        if isinstance(self.answer, list):
            return self.answer
        step = self.step or len(self.answer)
        return [self.answer[i:i + step] for i in range(0, len(self.answer), step)]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                self.requests.append(head + await reader.readexactly(length))
                await asyncio.sleep(self.delay)
                for part in self._parts():
                    writer.write(part)
                    await writer.drain()
                    if self.step or isinstance(self.answer, list):
                        await asyncio.sleep(0.001)
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
