"""Helpers for the ext_proc tests: directors over hand-filled datastores, ext_proc messages as Envoy sends
them, and a real ``grpc.aio`` streaming client."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web

from epp._pb.envoy.config.core.v3 import base_pb2
from epp.config.loader import build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.extproc.protocol import METHOD_PATH, BodySendMode, pb
from epp.framework.endpoint import Endpoint, EndpointSpec, Metrics
from epp.framework.plugins import ResponseInfo
from epp.headers import HeaderTrust
from epp.runtime.builtins import default_registry
from epp.scheduling.director import Director

FULL_DUPLEX = BodySendMode.FULL_DUPLEX_STREAMED
BUFFERED = BodySendMode.BUFFERED
STREAMED = BodySendMode.STREAMED

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hello there"}]}'


@dataclass
class Recorder:
    """A RequestMetrics that keeps what the request path recorded (the Director's metrics seam)."""

    tokens: list[tuple[str, str, int | None, int | None, int | None]] = field(default_factory=list)
    errors: list[tuple[str, str, str]] = field(default_factory=list)
    requests: int = 0
    running: int = 0

    def record_request(self, model: str, target: str, priority: int, fairness_id: str = "") -> None:
        self.requests += 1

    def record_error(self, model: str, target: str, code: str, fairness_id: str = "", priority: int = 0) -> None:
        self.errors.append((model, target, code))

    def completed(self, model: str, target: str, seconds: float, info: ResponseInfo, fairness_id: str = "",
                  priority: int = 0, ttft: float | None = None) -> None:
        self.running -= 1
        if not info.error:
            self.tokens.append((model, target, info.prompt_tokens, info.completion_tokens, info.cached_tokens))

    def running_inc(self, model: str, target: str = "", fairness_id: str = "", priority: int = 0) -> None:
        self.running += 1

    def scheduled(self, target_model: str, endpoint: Endpoint, seconds: float) -> None:
        return None

    def scheduler_attempt(self, status: str, target_model: str, endpoint: Endpoint | None) -> None:
        return None


def health_stubs(channel: grpc.aio.Channel):  # type: ignore[no-untyped-def]
    """The gRPC health service's ``Check`` and ``Watch`` callables on ``channel``."""
    from epp._pb.grpc.health.v1 import health_pb2

    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                response_deserializer=health_pb2.HealthCheckResponse.FromString)
    watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                 request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                 response_deserializer=health_pb2.HealthCheckResponse.FromString)
    return check, watch


async def health_list(channel: grpc.aio.Channel) -> dict[str, int]:
    """The gRPC health service's ``List`` answer on ``channel``: service name -> status."""
    from epp._pb.grpc.health.v1 import health_pb2

    call = channel.unary_unary("/grpc.health.v1.Health/List",
                               request_serializer=health_pb2.HealthListRequest.SerializeToString,
                               response_deserializer=health_pb2.HealthListResponse.FromString)
    answer = await call(health_pb2.HealthListRequest())
    return {name: resp.status for name, resp in answer.statuses.items()}


def make_director(specs: Iterable[EndpointSpec], config: str | None = None, *, metrics: object = None,
                  synced: bool = True, waiting: dict[str, int] | None = None,
                  header_trust: HeaderTrust | None = None) -> Director:
    """A Director over ``specs`` with the given config text (None: the reference default profile) and, when given,
    the header trust both front ends apply (default: no trusted-only header is trusted)."""
    from epp.config.loader import DEFAULT_CONFIG_TEXT

    pipeline = build_pipeline(*load_raw(config or DEFAULT_CONFIG_TEXT), default_registry(entry_points=False))
    store = Datastore()
    store.replace_all(specs)
    for ep in store.endpoints():
        ep.metrics = Metrics(waiting=(waiting or {}).get(ep.name, 0), update_time=1e12)
    if synced:
        store.mark_synced()
    return Director(pipeline, store, metrics=metrics, header_trust=header_trust)  # type: ignore[arg-type]


def specs(n: int, *, base_port: int = 8000, labels: Sequence[dict[str, str]] | None = None) -> list[EndpointSpec]:
    """``n`` endpoints at 10.0.0.<i+1>:<base_port> (nothing listens there; the protocol tests never connect)."""
    return [EndpointSpec(name=f"ep{i}", address=f"10.0.0.{i + 1}", port=base_port,
                         labels=(labels[i] if labels else {})) for i in range(n)]


# -- messages as Envoy sends them ---------------------------------------------------------------------------

def header_map(headers: dict[str, str]) -> base_pb2.HeaderMap:
    hm = base_pb2.HeaderMap()
    for k, v in headers.items():
        hm.headers.add(key=k, raw_value=v.encode())
    return hm


def request_headers(path: str = "/v1/chat/completions", headers: dict[str, str] | None = None, *,
                    eos: bool = False, mode: int | None = FULL_DUPLEX, response_mode: int = FULL_DUPLEX,
                    subset: list[str] | None = None,
                    subset_key: str = "x-gateway-destination-endpoint-subset") -> pb.ProcessingRequest:
    all_headers = {":method": "POST" if not eos else "GET", ":path": path, ":authority": "gw",
                   "content-type": "application/json", **(headers or {})}
    msg = pb.ProcessingRequest()
    msg.request_headers.headers.CopyFrom(header_map(all_headers))
    msg.request_headers.end_of_stream = eos
    if mode is not None:
        msg.protocol_config.request_body_mode = mode  # type: ignore[assignment]
        msg.protocol_config.response_body_mode = response_mode  # type: ignore[assignment]
    if subset is not None:
        lst = msg.metadata_context.filter_metadata["envoy.lb.subset_hint"].fields[subset_key].list_value
        lst.SetInParent()  # an empty list is still a list (Envoy sends it as one)
        for s in subset:
            lst.values.add(string_value=s)
    return msg


def request_body(data: bytes, eos: bool = True) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest()
    msg.request_body.body = data
    msg.request_body.end_of_stream = eos
    return msg


def response_headers(status: int = 200, content_type: str = "application/json", *, eos: bool = False,
                     upstream: str | None = None, served: str | None = None,
                     served_key: str = "x-gateway-destination-endpoint-served",
                     extra: dict[str, str] | None = None) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest()
    msg.response_headers.headers.CopyFrom(header_map({":status": str(status), "content-type": content_type,
                                                      **(extra or {})}))
    msg.response_headers.end_of_stream = eos
    if upstream is not None:
        msg.attributes["envoy.filters.http.ext_proc"].fields["upstream.address"].string_value = upstream
    if served is not None:
        msg.metadata_context.filter_metadata["envoy.lb"].fields[served_key].string_value = served
    return msg


def response_body(data: bytes, eos: bool = True) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest()
    msg.response_body.body = data
    msg.response_body.end_of_stream = eos
    return msg


def set_headers(common: pb.CommonResponse) -> dict[str, str]:
    return {o.header.key: o.header.raw_value.decode() for o in common.header_mutation.set_headers}


class Client:
    """A raw ext_proc client over one HTTP/2 channel (as Envoy: many concurrent streams on one connection)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self._method = channel.stream_stream(METHOD_PATH, request_serializer=pb.ProcessingRequest.SerializeToString,
                                             response_deserializer=pb.ProcessingResponse.FromString)

    def open(self) -> grpc.aio.StreamStreamCall:
        """A new stream: ``await call.write(msg)``, ``await call.read()``, ``await call.done_writing()``."""
        return self._method()

    def open_raw(self) -> grpc.aio.StreamStreamCall:
        """A new stream whose writes are raw message bytes (``msg.SerializeToString()``, or bytes that are no
        ``ProcessingRequest`` at all); replies are decoded as with :meth:`open`."""
        return self.channel.stream_stream(METHOD_PATH, response_deserializer=pb.ProcessingResponse.FromString)()

    async def exchange(self, messages: Sequence[pb.ProcessingRequest], replies: int) -> list[pb.ProcessingResponse]:
        """Send ``messages``, half-close, and read ``replies`` replies (fewer if the stream ends)."""
        call = self.open()
        for m in messages:
            await call.write(m)
        out = []
        for _ in range(replies):
            r = await call.read()
            if r is grpc.aio.EOF:
                break
            out.append(r)
        await call.done_writing()
        call.cancel()
        return out


class EchoServer:
    """A tiny OpenAI-shaped upstream that reports what it received: body size and digest, framing headers and
    the routing headers; ``hits`` counts requests. Used where the simulator's behaviour would get in the way
    (8 MB bodies, header inspection, a trap that must never be reached)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.hits = 0
        self._runner: web.AppRunner | None = None

    @property
    def hostport(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        body = await request.read()
        return web.json_response({
            "id": "echo", "object": "chat.completion", "model": "m", "port": self.port, "received": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "content_length": request.headers.get("content-length"),
            "transfer_encoding": request.headers.get("transfer-encoding"),
            "headers": {k.lower(): v for k, v in request.headers.items() if k.lower().startswith("x-")},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        })

    async def start(self) -> None:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def route_body(client: Any, path: str, body: bytes, headers: dict[str, str] | None = None
                     ) -> tuple[pb.ProcessingResponse, bytes]:
    """One request through an ext_proc stream (``client.open()``): the routing reply and the request body EPP
    sends upstream (its streamed body mutations, joined)."""
    call = client.open()
    await call.write(request_headers(path, headers))
    await call.write(request_body(body))
    first = await call.read()
    forwarded = b""
    if first.WhichOneof("response") == "request_headers":
        while True:
            sr = (await call.read()).request_body.response.body_mutation.streamed_response
            forwarded += sr.body
            if sr.end_of_stream:
                break
    call.cancel()
    return first, forwarded
