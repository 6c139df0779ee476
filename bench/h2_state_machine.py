"""CPU per ext_proc-shaped exchange through two HTTP/2 server state machines: the ``h2`` package's (python-hyper)
and EPP's own :class:`epp.extproc.h2.connection.H2Connection`, in one process, without sockets.

One exchange is what Envoy and EPP trade for one proxied request in FULL_DUPLEX_STREAMED mode: a stream opened
with gRPC request headers, five length-prefixed messages in (request headers, a 4 KB body, its end, response
headers, response body) and four out, then trailers. An ``h2`` client (not timed) produces the client's bytes and
reads the server's; only the server's calls are timed. The application above each server does nothing but answer,
so the figures are the state machines' own cost.

    python -m bench.h2_state_machine [--exchanges 20000] [--concurrency 1]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings

from epp.extproc.h2.connection import H2Connection, H2Limits
from epp.extproc.h2.hpack import encode_headers

REQUEST_HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", "/envoy.service.ext_proc.v3.ExternalProcessor/Process"),
                   (":authority", "epp"), ("content-type", "application/grpc"), ("te", "trailers"),
                   ("grpc-timeout", "200m"), ("x-envoy-internal", "true"), ("x-request-id", "0b5e1c3a")]
IN_MESSAGES = [300, 4200, 120, 300, 250]  # payload sizes, each framed as one gRPC message in one DATA frame
OUT_MESSAGES = [200, 4300, 150, 150]
RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
TRAILERS = [(b"grpc-status", b"0")]


def grpc_message(size: int) -> bytes:
    return b"\x00" + size.to_bytes(4, "big") + b"m" * size


class _Client:
    """The Envoy side: opens streams and sends the messages; acknowledges what it receives."""

    def __init__(self) -> None:
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        big = 256 << 20  # Envoy's default windows: the servers' sends never wait for a WINDOW_UPDATE
        self.conn.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: big})
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(big)
        self.ended = 0

    def preface(self) -> bytes:
        return self.conn.data_to_send()

    def open(self) -> bytes:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, REQUEST_HEADERS)
        for i, size in enumerate(IN_MESSAGES):
            self.conn.send_data(sid, grpc_message(size), end_stream=i == len(IN_MESSAGES) - 1)
        return self.conn.data_to_send()

    def receive(self, data: bytes) -> bytes:
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.ended += 1
        return self.conn.data_to_send()


class _HyperServer:
    """The ``h2`` package as EPP's server state machine would use it."""

    def __init__(self) -> None:
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        limits = H2Limits()  # the same windows as EPP's
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: limits.initial_stream_window,
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams})
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(limits.initial_connection_window - 65535)
        self.replies: dict[int, int] = {}
        self.response = [(k.decode(), v.decode()) for k, v in RESPONSE_HEADERS]
        self.trailers = [(k.decode(), v.decode()) for k, v in TRAILERS]
        self.out = [grpc_message(n) for n in OUT_MESSAGES]

    def feed(self, data: bytes) -> bytes:
        conn = self.conn
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                self.replies[event.stream_id] = 0
                conn.send_headers(event.stream_id, self.response)
            elif isinstance(event, h2.events.DataReceived):
                sid = event.stream_id
                conn.acknowledge_received_data(event.flow_controlled_length, sid)
                n = self.replies[sid]
                if n < len(self.out):
                    conn.send_data(sid, self.out[n])
                    self.replies[sid] = n + 1
            elif isinstance(event, h2.events.StreamEnded):
                del self.replies[event.stream_id]
                conn.send_headers(event.stream_id, self.trailers, end_stream=True)
        return conn.data_to_send()


class _Transport:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(data)

    def take(self) -> bytes:
        out, self.chunks = b"".join(self.chunks), []
        return out

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class _Loop:
    """Stands in for the event loop so that the timed code is the state machine, not the loop's scheduling."""

    def __init__(self) -> None:
        self.soon: list[Callable[[], object]] = []

    def call_soon(self, callback: Callable[[], object]) -> None:
        self.soon.append(callback)

    def time(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        return asyncio.TimerHandle(when, callback, (), asyncio.new_event_loop())

    def call_later(self, delay: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        return self.call_at(time.monotonic() + delay, callback)

    def run(self) -> None:
        soon, self.soon = self.soon, []
        for callback in soon:
            callback()


class _EppApp:
    def __init__(self) -> None:
        self.conn: H2Connection
        self.replies: dict[int, int] = {}
        self.response = encode_headers(RESPONSE_HEADERS)
        self.trailers = encode_headers(TRAILERS)
        self.out = [grpc_message(n) for n in OUT_MESSAGES]

    def headers_received(self, conn: H2Connection, stream_id: int, headers: list[tuple[bytes, bytes]],
                         end_stream: bool) -> None:
        self.replies[stream_id] = 0
        conn.send_headers(stream_id, self.response)

    def data_received(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        conn = self.conn
        if data:
            conn.consume(stream_id, len(data))
            n = self.replies[stream_id]
            if n < len(self.out):
                conn.send_data(stream_id, self.out[n])
                self.replies[stream_id] = n + 1
        if end_stream:
            del self.replies[stream_id]
            conn.finish(stream_id, self.trailers)

    def stream_reset(self, stream_id: int) -> None:
        self.replies.pop(stream_id, None)


class _EppServer:
    def __init__(self) -> None:
        self.app = _EppApp()
        self.conn = H2Connection(self.app, limits=H2Limits(idle_timeout=0))
        self.app.conn = self.conn
        self.transport = _Transport()
        self.loop = _Loop()

    async def start(self) -> None:
        self.conn.connection_made(self.transport)  # type: ignore[arg-type]
        self.conn._flush()  # the SETTINGS queued on the real loop
        self.conn._loop = self.loop  # type: ignore[assignment]

    def feed(self, data: bytes) -> bytes:
        self.conn.data_received(data)
        self.loop.run()
        return self.transport.take()


def measure(server: Any, exchanges: int, concurrency: int) -> float:
    """Seconds of server CPU for ``exchanges`` exchanges, ``concurrency`` streams opened per round."""
    client = _Client()
    client.receive(server.feed(client.preface()))
    spent = 0.0
    done = 0
    while done < exchanges:
        batch = b"".join(client.open() for _ in range(concurrency))
        start = time.process_time()
        out = server.feed(batch)
        spent += time.process_time() - start
        while back := client.receive(out):  # window updates and acknowledgements, until both sides are quiet
            start = time.process_time()
            out = server.feed(back)
            spent += time.process_time() - start
        done += concurrency
    assert client.ended == done, (client.ended, done)
    return spent


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchanges", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=1, help="streams opened together per round")
    parser.add_argument("--rounds", type=int, default=3, help="best of this many runs each")
    args = parser.parse_args()
    ours = hyper = float("inf")
    for _ in range(args.rounds):
        epp = _EppServer()
        await epp.start()
        ours = min(ours, measure(epp, args.exchanges, args.concurrency))
        hyper = min(hyper, measure(_HyperServer(), args.exchanges, args.concurrency))
    n = args.exchanges
    print(f"{n} exchanges, {args.concurrency} stream(s) per round, best of {args.rounds}")
    print("| state machine | µs per exchange |\n| --- | --- |")
    print(f"| epp.extproc.h2.connection | {ours / n * 1e6:.1f} |")
    print(f"| h2 {h2.__version__} | {hyper / n * 1e6:.1f} |")
    print(f"ratio h2 / epp: {hyper / ours:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
