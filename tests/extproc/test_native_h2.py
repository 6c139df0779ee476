"""EPP's own HTTP/2 gRPC transport, driven by a raw HTTP/2 client (python-hyper ``h2``) for what grpcio's client
never does on its own: tiny flow-control windows, messages split across frames, resets, compressed messages,
unknown methods, PING, malformed header blocks and GOAWAY on shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from epp.extproc import ExtProcServer
from epp.extproc.protocol import METHOD_PATH, pb
from epp.scheduling.director import Director

from ..conftest import eventually
from .helpers import (
    CHAT,
    make_director,
    request_body,
    request_headers,
    set_headers,
    specs,
)

GRPC_HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", METHOD_PATH), (":authority", "epp"),
                ("content-type", "application/grpc"), ("te", "trailers")]


def grpc_frame(msg: pb.ProcessingRequest, compressed: bool = False) -> bytes:
    data = msg.SerializeToString()
    return bytes([1 if compressed else 0]) + len(data).to_bytes(4, "big") + data


def grpc_messages(data: bytes) -> list[pb.ProcessingResponse]:
    out, pos = [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos + 1:pos + 5], "big")
        out.append(pb.ProcessingResponse.FromString(data[pos + 5:pos + 5 + size]))
        pos += 5 + size
    return out


@dataclass
class StreamLog:
    headers: dict[str, str] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    trailers: dict[str, str] = field(default_factory=dict)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    got_data: asyncio.Event = field(default_factory=asyncio.Event)
    reset: bool = False

    @property
    def status(self) -> int:
        return int((self.trailers or self.headers)["grpc-status"])

    @property
    def message(self) -> str:
        """``grpc-message`` from the trailers (or the headers of a trailers-only response)."""
        return (self.trailers or self.headers).get("grpc-message", "")


class H2Client:
    """A raw HTTP/2 client connection; flow control is acknowledged only when ``auto_ack`` is set."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, auto_ack: bool) -> None:
        self.reader, self.writer, self.auto_ack = reader, writer, auto_ack
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.streams: dict[int, StreamLog] = {}
        self.events: list[h2.events.Event] = []
        self.closed = asyncio.Event()
        self.settled = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, port: int, *, window: int | None = None, auto_ack: bool = True) -> H2Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer, auto_ack)
        client.conn.initiate_connection()
        if window is not None:
            client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        client.flush()
        client._task = asyncio.create_task(client._read())
        await asyncio.wait_for(client.settled.wait(), 5)  # EPP's SETTINGS (frame size, windows) are known
        return client

    def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())

    def open(self, headers: list[tuple[str, str]] = GRPC_HEADERS, end: bool = False) -> int:
        sid = self.conn.get_next_available_stream_id()
        self.streams[sid] = StreamLog()
        self.conn.send_headers(sid, headers, end_stream=end)
        self.flush()
        return sid

    def send(self, sid: int, data: bytes, end: bool = False) -> None:
        step = self.conn.max_outbound_frame_size
        for i in range(0, len(data), step):
            self.conn.send_data(sid, data[i:i + step], end_stream=end and i + step >= len(data))
        if end and not data:
            self.conn.send_data(sid, b"", end_stream=True)
        self.flush()

    async def call(self, messages: list[pb.ProcessingRequest], **kw: bool) -> StreamLog:
        sid = self.open()
        self.send(sid, b"".join(grpc_frame(m, **kw) for m in messages), end=True)
        await asyncio.wait_for(self.streams[sid].ended.wait(), 5)
        return self.streams[sid]

    async def _read(self) -> None:
        while data := await self.reader.read(65536):
            for event in self.conn.receive_data(data):
                self._event(event)
            self.flush()
        self.closed.set()

    def _event(self, event: h2.events.Event) -> None:
        self.events.append(event)
        if isinstance(event, h2.events.RemoteSettingsChanged):
            self.settled.set()
        log = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived) and log is not None:
            log.headers = dict(event.headers)
        elif isinstance(event, h2.events.TrailersReceived) and log is not None:
            log.trailers = dict(event.headers)
        elif isinstance(event, h2.events.DataReceived) and log is not None:
            log.data += event.data
            log.got_data.set()
            if self.auto_ack:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and log is not None:
            log.ended.set()
        elif isinstance(event, h2.events.StreamReset) and log is not None:
            log.reset = True
            log.ended.set()

    async def close(self) -> None:
        self.writer.close()
        if self._task is not None:
            self._task.cancel()


@pytest.fixture
async def server() -> AsyncIterator[ExtProcServer]:
    director = make_director(specs(2))
    srv = ExtProcServer(director, host="127.0.0.1", port=0, health_port=None, plaintext=True)
    await srv.start()
    yield srv
    await srv.stop(0)


def inflight(director: Director) -> int:
    return sum(ep.inflight_requests for ep in director.datastore.endpoints())


async def test_a_routed_request_over_raw_http2(server: ExtProcServer) -> None:
    client = await H2Client.connect(server.port)
    log = await client.call([request_headers(), request_body(CHAT)])
    assert log.headers[":status"] == "200" and log.headers["content-type"] == "application/grpc"
    assert log.status == 0
    head, body = grpc_messages(bytes(log.data))
    assert set_headers(head.request_headers.response)["x-gateway-destination-endpoint"].startswith("10.0.0.")
    assert body.request_body.response.body_mutation.streamed_response.body == CHAT
    await client.close()


async def test_replies_wait_for_window_updates_when_the_peer_window_is_tiny(server: ExtProcServer) -> None:
    """A 40 KB body comes back as streamed chunks; with a 100-byte stream window EPP sends 100 bytes, then waits
    for WINDOW_UPDATE, and the reassembled replies are intact."""
    big = b'{"model":"m","prompt":"' + b"x" * 40_000 + b'"}'
    client = await H2Client.connect(server.port, window=100, auto_ack=False)
    sid = client.open()
    client.send(sid, grpc_frame(request_headers("/v1/completions")) + grpc_frame(request_body(big)), end=True)
    log = client.streams[sid]
    await asyncio.wait_for(log.got_data.wait(), 5)
    await asyncio.sleep(0.1)
    assert len(log.data) == 100 and not log.ended.is_set()
    while not log.ended.is_set():
        client.conn.acknowledge_received_data(len(log.data), sid)
        client.conn.increment_flow_control_window(1 << 20)
        client.conn.increment_flow_control_window(1 << 20, sid)
        client.flush()
        await asyncio.wait_for(log.ended.wait(), 5)
    head, *chunks = grpc_messages(bytes(log.data))
    assert head.WhichOneof("response") == "request_headers"
    assert b"".join(c.request_body.response.body_mutation.streamed_response.body for c in chunks) == big
    assert log.status == 0
    await client.close()


async def test_a_message_split_across_many_frames_is_reassembled(server: ExtProcServer) -> None:
    client = await H2Client.connect(server.port)
    sid = client.open()
    data = grpc_frame(request_headers()) + grpc_frame(request_body(CHAT))
    for i in range(0, len(data), 7):
        client.send(sid, data[i:i + 7])
        await asyncio.sleep(0)
    client.send(sid, b"", end=True)
    await asyncio.wait_for(client.streams[sid].ended.wait(), 5)
    head, _ = grpc_messages(bytes(client.streams[sid].data))
    assert "x-gateway-destination-endpoint" in set_headers(head.request_headers.response)
    await client.close()


async def test_unknown_method_and_compressed_messages_get_grpc_unimplemented(server: ExtProcServer) -> None:
    client = await H2Client.connect(server.port)
    other = [(k, "/grpc.health.v1.Health/Check" if k == ":path" else v) for k, v in GRPC_HEADERS]
    sid = client.open(other, end=True)
    await asyncio.wait_for(client.streams[sid].ended.wait(), 5)
    assert client.streams[sid].status == 12
    log = await client.call([request_headers()], compressed=True)
    assert log.status == 12 and "compressed" in log.message
    await client.close()


async def test_an_undecodable_message_fails_its_stream_only(server: ExtProcServer) -> None:
    client = await H2Client.connect(server.port)
    good = client.open()
    client.send(good, grpc_frame(request_headers()))
    bad = client.open()
    client.send(bad, b"\x00\x00\x00\x00\x03\xff\xff\xff", end=True)
    await asyncio.wait_for(client.streams[bad].ended.wait(), 5)
    assert client.streams[bad].status == 3
    client.send(good, grpc_frame(request_body(CHAT)), end=True)
    await asyncio.wait_for(client.streams[good].ended.wait(), 5)
    assert client.streams[good].status == 0 and len(grpc_messages(bytes(client.streams[good].data))) == 2
    await client.close()


async def test_a_client_reset_releases_the_in_flight_request(server: ExtProcServer) -> None:
    director = server.director
    client = await H2Client.connect(server.port)
    sid = client.open()
    client.send(sid, grpc_frame(request_headers()) + grpc_frame(request_body(CHAT)))
    await asyncio.wait_for(client.streams[sid].got_data.wait(), 5)
    assert inflight(director) == 1 and server.active_streams == 1
    client.conn.reset_stream(sid)
    client.flush()
    await eventually(lambda: inflight(director) == 0 and server.active_streams == 0)
    assert (await client.call([request_headers("/v1/models", eos=True)])).status == 0  # the connection lives on
    await client.close()


async def test_a_lost_connection_releases_every_open_request(server: ExtProcServer) -> None:
    director = server.director
    client = await H2Client.connect(server.port)
    for _ in range(3):
        sid = client.open()
        client.send(sid, grpc_frame(request_headers()) + grpc_frame(request_body(CHAT)))
        await asyncio.wait_for(client.streams[sid].got_data.wait(), 5)
    assert inflight(director) == 3
    await client.close()
    await eventually(lambda: inflight(director) == 0 and server.active_streams == 0)


async def test_ping_is_acknowledged(server: ExtProcServer) -> None:
    client = await H2Client.connect(server.port)
    client.conn.ping(b"12345678")
    client.flush()
    await eventually(lambda: any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"12345678"
                               for e in client.events))
    await client.close()


async def test_a_malformed_header_block_ends_the_connection_with_compression_error(server: ExtProcServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000"))
    writer.write(bytes.fromhex("000001010500000001") + b"\x80")  # HEADERS, END_HEADERS|END_STREAM, index 0
    data = await asyncio.wait_for(reader.read(), 5)  # everything until EPP closes the connection
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    events = conn.receive_data(data)
    goaway = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    assert goaway and goaway[0].error_code == 9  # COMPRESSION_ERROR
    writer.close()


async def test_a_client_without_the_http2_preface_is_disconnected(server: ExtProcServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(reader.read(), 5)
    assert reader.at_eof()
    writer.close()


async def test_stop_sends_goaway_naming_the_last_stream_and_waits_for_it(server: ExtProcServer) -> None:
    """The open stream's answer is checked with grpcio's client in test_server.py (h2 stops sending after a
    GOAWAY); here: the GOAWAY itself, and that stop() returns once the stream is done, not at the grace limit."""
    client = await H2Client.connect(server.port)
    sid = client.open()
    client.send(sid, grpc_frame(request_headers()))
    await eventually(lambda: server.active_streams == 1)
    stopping = asyncio.create_task(server.stop(grace=30))
    await eventually(lambda: any(isinstance(e, h2.events.ConnectionTerminated) for e in client.events))
    goaway = next(e for e in client.events if isinstance(e, h2.events.ConnectionTerminated))
    assert goaway.error_code == 0 and goaway.last_stream_id == sid
    assert not stopping.done()
    body = grpc_frame(request_body(CHAT))
    frame = len(body).to_bytes(3, "big") + b"\x00\x01" + sid.to_bytes(4, "big") + body  # DATA, END_STREAM
    client.writer.write(frame)
    await asyncio.wait_for(stopping, 5)
    await client.close()


async def test_late_frames_for_a_finished_stream_leave_the_connection_up(server: ExtProcServer) -> None:
    """EPP ends a stream before the client half-closed (here: a compressed message, refused at once); frames
    the client had in flight for it, DATA or trailing HEADERS, are dropped without harming the connection."""
    client = await H2Client.connect(server.port)
    sid = client.open()
    client.send(sid, grpc_frame(request_headers(), compressed=True))
    await asyncio.wait_for(client.streams[sid].ended.wait(), 5)
    late_data = grpc_frame(request_body(CHAT))
    client.writer.write(len(late_data).to_bytes(3, "big") + b"\x00\x00" + sid.to_bytes(4, "big") + late_data)
    client.writer.write(b"\x00\x00\x01\x01\x05" + sid.to_bytes(4, "big") + b"\x88")  # HEADERS, END_STREAM
    log = await client.call([request_headers(), request_body(CHAT)])
    assert log.status == 0 and len(grpc_messages(bytes(log.data))) == 2
    assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in client.events)
    await client.close()


async def test_a_second_request_in_one_call_gets_invalid_argument_and_releases_the_first(
        server: ExtProcServer) -> None:
    client = await H2Client.connect(server.port)
    log = await client.call([request_headers(), request_body(CHAT), request_headers(), request_body(CHAT)])
    assert log.status == 3 and "second request_headers" in log.message
    director = server.settings.director
    await eventually(lambda: inflight(director) == 0)
    await client.close()


async def test_a_bad_message_arriving_with_the_routing_message_releases_what_was_routed(
        server: ExtProcServer) -> None:
    """The routing message and an undecodable one in the same read: the call ends (INVALID_ARGUMENT) while
    routing runs; the routing task is cancelled or, if it finished, its request is released, never kept."""
    client = await H2Client.connect(server.port)
    director = server.settings.director
    for _ in range(5):
        sid = client.open()
        bad = b"\x00" + (5).to_bytes(4, "big") + b"\xff\xff\xff\xff\xff"
        client.send(sid, grpc_frame(request_headers()) + grpc_frame(request_body(CHAT)) + bad, end=True)
        await asyncio.wait_for(client.streams[sid].ended.wait(), 5)
        assert client.streams[sid].status == 3
    await eventually(lambda: inflight(director) == 0 and server.active_streams == 0)
    await client.close()
