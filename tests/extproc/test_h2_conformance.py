"""RFC 9113 / RFC 7541 error handling of EPP's own HTTP/2 transport, case by case after h2spec's list (sections
3.5, 4.1-4.3, 5.1-5.5, 6.1-6.10, 8.1 and HPACK 2.3, 4.2, 5.2, 6.1-6.3).

Each case drives a real :class:`~epp.extproc.h2.server.NativeServer` on 127.0.0.1 with raw frames over a socket and
asserts the exact outcome: GOAWAY with an error code (and the connection closed), RST_STREAM with an error code
(and the connection still usable), or the frame accepted (the connection still answers a PING and a request).
``Peer`` here is also the raw client of ``test_h2_limits.py``."""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import hpack
import pytest

from epp.extproc.h2.connection import ErrorCode, H2Limits
from epp.extproc.h2.server import NativeServer
from epp.extproc.protocol import METHOD_PATH, pb
from epp.extproc.stream import StreamSettings

from .helpers import CHAT, make_director, request_body, request_headers, specs

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, ENABLE_PUSH = 0x4, 0x5, 0x2
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GRPC = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", METHOD_PATH.encode()), (b":authority", b"epp"),
        (b"content-type", b"application/grpc"), (b"te", b"trailers")]


@dataclass
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes

    @property
    def error_code(self) -> int:
        return int.from_bytes(self.payload[4:8] if self.kind == GOAWAY else self.payload[:4], "big")

    @property
    def last_stream(self) -> int:
        return int.from_bytes(self.payload[:4], "big") & 0x7FFFFFFF


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">L", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">L", stream) + payload


def grpc_frame(msg: pb.ProcessingRequest) -> bytes:
    data = msg.SerializeToString()
    return b"\x00" + len(data).to_bytes(4, "big") + data


class Peer:
    """A raw HTTP/2 client: frames go out exactly as given; frames coming in are parsed and kept in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()
        self.server_settings: dict[int, int] = {}
        self.seen: list[Frame] = []

    @classmethod
    async def connect(cls, port: int, settings: dict[int, int] | None = None, *, handshake: bool = True) -> Peer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        peer = cls(reader, writer)
        if handshake:
            payload = b"".join(struct.pack(">HL", k, v) for k, v in (settings or {}).items())
            peer.write(PREFACE + frame(SETTINGS, 0, 0, payload))
            first = await peer.next()
            assert first is not None and first.kind == SETTINGS and not first.flags & ACK
            peer.server_settings = dict(struct.iter_unpack(">HL", first.payload))
            peer.write(frame(SETTINGS, ACK, 0))
        return peer

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, kind: int, flags: int, stream: int, payload: bytes = b"") -> None:
        self.write(frame(kind, flags, stream, payload))

    def block(self, fields: list[tuple[bytes, bytes]] = GRPC) -> bytes:
        """An HPACK block from this connection's encoder (blocks must then be sent in the order built)."""
        return self.encoder.encode(fields)

    def headers(self, stream: int, fields: list[tuple[bytes, bytes]] = GRPC, *, end_stream: bool = False) -> None:
        self.send(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream, self.block(fields))

    async def next(self, timeout: float = 10.0) -> Frame | None:
        """The next frame from the server; None once it closed the connection."""
        try:
            head = await asyncio.wait_for(self.reader.readexactly(9), timeout)
            payload = await asyncio.wait_for(self.reader.readexactly(int.from_bytes(head[:3], "big")), timeout)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        got = Frame(head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload)
        self.seen.append(got)
        return got

    async def read_until(self, match: Callable[[Frame], object], what: str) -> Frame:
        while (got := await self.next()) is not None:
            if match(got):
                return got
            assert got.kind != GOAWAY or match(got), f"GOAWAY {got.error_code} while waiting for {what}"
        raise AssertionError(f"connection closed while waiting for {what}")

    async def expect_goaway(self, code: int) -> Frame:
        """A GOAWAY with ``code``, then the server closes the connection."""
        goaway = await self.read_until(lambda f: f.kind == GOAWAY, "GOAWAY")
        assert goaway.error_code == code, f"GOAWAY {goaway.error_code}, expected {code}"
        while await self.next() is not None:
            pass
        return goaway

    async def expect_rst(self, stream: int, code: int) -> None:
        """RST_STREAM ``code`` on ``stream``; the connection stays up."""
        rst = await self.read_until(lambda f: f.kind == RST_STREAM and f.stream == stream, f"RST_STREAM on {stream}")
        assert rst.error_code == code, f"RST_STREAM {rst.error_code}, expected {code}"
        await self.expect_alive()

    async def expect_alive(self) -> list[Frame]:
        """The connection answers a PING; returns the frames that came before the answer."""
        token = os.urandom(8)
        start = len(self.seen)
        self.send(PING, 0, 0, token)
        await self.read_until(lambda f: f.kind == PING and f.flags & ACK and f.payload == token, "PING ACK")
        return self.seen[start:-1]

    async def response(self, stream: int) -> Frame:
        """The frame that ends ``stream`` (HEADERS with END_STREAM)."""
        return await self.read_until(lambda f: f.kind == HEADERS and f.stream == stream and bool(f.flags & END_STREAM),
                                     f"the end of stream {stream}")


    async def expect_served(self, stream: int) -> None:
        """A complete request on ``stream`` (HEADERS with END_STREAM) gets its gRPC answer."""
        self.headers(stream, end_stream=True)
        await self.response(stream)

    async def close(self) -> None:
        self.writer.close()


async def start_server(limits: H2Limits | None = None, max_recv: int = 1 << 20) -> NativeServer:
    server = NativeServer(StreamSettings(make_director(specs(2))), max_recv, 1 << 20, limits=limits)
    await server.start("127.0.0.1", 0, None)
    return server


def server_port(server: NativeServer) -> int:
    assert server._server is not None
    return int(server._server.sockets[0].getsockname()[1])


@pytest.fixture
async def port() -> AsyncIterator[int]:
    server = await start_server()
    yield server_port(server)
    await server.stop(0)


@pytest.fixture
async def peer(port: int) -> AsyncIterator[Peer]:
    client = await Peer.connect(port)
    yield client
    await client.close()


# -- 3.5 HTTP/2 connection preface ------------------------------------------------------------------------------

async def test_3_5_1_the_server_answers_the_preface_with_settings(port: int) -> None:
    peer = await Peer.connect(port)  # asserts the first frame is a SETTINGS without ACK
    assert peer.server_settings[0x3] == H2Limits().max_concurrent_streams
    await peer.expect_served(1)


async def test_3_5_2_an_invalid_preface_is_a_protocol_error(port: int) -> None:
    peer = await Peer.connect(port, handshake=False)
    peer.write(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_3_5_3_a_preface_not_followed_by_settings_is_a_protocol_error(port: int) -> None:
    peer = await Peer.connect(port, handshake=False)
    peer.write(PREFACE + frame(PING, 0, 0, b"12345678"))
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


# -- 4.1 frame format, 4.2 frame size, 4.3 header compression ---------------------------------------------------

async def test_4_1_1_an_unknown_frame_type_is_ignored(peer: Peer) -> None:
    peer.send(0xEE, 0, 0, b"whatever")
    await peer.expect_alive()
    await peer.expect_served(1)


async def test_4_1_2_undefined_flags_are_ignored(peer: Peer) -> None:
    peer.send(PING, 0xFE, 0, b"abcdefgh")
    ack = await peer.read_until(lambda f: f.kind == PING, "PING ACK")
    assert ack.flags == ACK and ack.payload == b"abcdefgh"


async def test_4_1_3_the_reserved_stream_id_bit_is_ignored(peer: Peer) -> None:
    peer.send(HEADERS, END_HEADERS | END_STREAM, 0x80000001, peer.block())
    assert (await peer.response(1)).stream == 1


async def test_4_2_1_a_data_frame_of_16384_bytes_is_accepted(peer: Peer) -> None:
    peer.headers(1)
    peer.send(DATA, 0, 1, b"\x00" + (100_000).to_bytes(4, "big") + b"x" * 16379)  # a message still incomplete
    assert not [f for f in await peer.expect_alive() if f.kind in (RST_STREAM, GOAWAY)]


async def test_4_2_2_data_larger_than_max_frame_size_is_a_frame_size_error(peer: Peer) -> None:
    peer.headers(1)
    size = (peer.server_settings[MAX_FRAME_SIZE] + 1).to_bytes(3, "big")
    peer.write(size + bytes([DATA, 0]) + (1).to_bytes(4, "big"))  # the header says it all: no payload sent
    await peer.expect_goaway(ErrorCode.FRAME_SIZE_ERROR)


async def test_4_2_3_headers_larger_than_max_frame_size_is_a_frame_size_error(peer: Peer) -> None:
    size = (peer.server_settings[MAX_FRAME_SIZE] + 1).to_bytes(3, "big")
    peer.write(size + bytes([HEADERS, END_HEADERS]) + (1).to_bytes(4, "big"))  # no payload needed
    await peer.expect_goaway(ErrorCode.FRAME_SIZE_ERROR)


async def test_4_3_1_an_invalid_header_block_is_a_compression_error(peer: Peer) -> None:
    peer.send(HEADERS, END_HEADERS | END_STREAM, 1, b"\x80")  # indexed field 0
    await peer.expect_goaway(ErrorCode.COMPRESSION_ERROR)


async def test_4_3_2_priority_inside_a_header_block_is_a_protocol_error(peer: Peer) -> None:
    peer.send(HEADERS, END_STREAM, 1, peer.block())
    peer.send(PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_4_3_3_headers_for_another_stream_inside_a_header_block_is_a_protocol_error(peer: Peer) -> None:
    peer.send(HEADERS, END_STREAM, 1, peer.block())
    peer.send(HEADERS, END_HEADERS | END_STREAM, 3, peer.block())
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


# -- 5.1 stream states ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, payload", [(DATA, b"x"), (RST_STREAM, b"\x00\x00\x00\x08"),
                                           (WINDOW_UPDATE, b"\x00\x00\x00\x01"), (CONTINUATION, b"\x88")],
                         ids=["5.1.1-data", "5.1.2-rst-stream", "5.1.3-window-update", "5.1.4-continuation"])
async def test_5_1_idle_stream_frames_are_protocol_errors(peer: Peer, kind: int, payload: bytes) -> None:
    peer.send(kind, END_HEADERS if kind == CONTINUATION else 0, 1, payload)
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def half_closed_remote(peer: Peer) -> None:
    """Stream 1 half-closed (remote): the client has ended it, and EPP's answer waits for flow control (the
    peer's initial window is 0), so EPP's side stays open."""
    peer.headers(1)
    peer.send(DATA, END_STREAM, 1, grpc_frame(request_headers()) + grpc_frame(request_body(CHAT)))
    await peer.read_until(lambda f: f.kind == HEADERS and f.stream == 1, "response headers on stream 1")


async def test_5_1_5_data_on_a_half_closed_remote_stream_is_stream_closed(port: int) -> None:
    peer = await Peer.connect(port, {INITIAL_WINDOW_SIZE: 0})
    await half_closed_remote(peer)
    peer.send(DATA, 0, 1, b"late")
    await peer.expect_rst(1, ErrorCode.STREAM_CLOSED)


async def test_5_1_6_headers_on_a_half_closed_remote_stream_is_stream_closed(port: int) -> None:
    peer = await Peer.connect(port, {INITIAL_WINDOW_SIZE: 0})
    await half_closed_remote(peer)
    peer.headers(1, [(b"x-trailer", b"1")], end_stream=True)
    await peer.expect_rst(1, ErrorCode.STREAM_CLOSED)


async def test_5_1_7_continuation_on_a_half_closed_remote_stream_is_a_protocol_error(port: int) -> None:
    peer = await Peer.connect(port, {INITIAL_WINDOW_SIZE: 0})
    await half_closed_remote(peer)
    peer.send(CONTINUATION, END_HEADERS, 1, b"\x88")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


def reset_by_client(peer: Peer) -> None:
    peer.headers(1)
    peer.send(RST_STREAM, 0, 1, (ErrorCode.CANCEL).to_bytes(4, "big"))


async def test_5_1_8_data_after_the_client_reset_the_stream_is_stream_closed(peer: Peer) -> None:
    reset_by_client(peer)
    peer.send(DATA, 0, 1, b"late")
    await peer.expect_rst(1, ErrorCode.STREAM_CLOSED)


async def test_5_1_9_headers_after_the_client_reset_the_stream_is_stream_closed(peer: Peer) -> None:
    reset_by_client(peer)
    peer.headers(1, [(b"x-trailer", b"1")], end_stream=True)
    await peer.expect_rst(1, ErrorCode.STREAM_CLOSED)


async def test_5_1_10_continuation_after_the_client_reset_the_stream_is_a_protocol_error(peer: Peer) -> None:
    reset_by_client(peer)
    peer.send(CONTINUATION, END_HEADERS, 1, b"\x88")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_5_1_11_data_on_a_closed_stream_is_stream_closed(peer: Peer) -> None:
    await peer.expect_served(1)
    peer.send(DATA, 0, 1, b"late")
    await peer.expect_goaway(ErrorCode.STREAM_CLOSED)


async def test_5_1_12_headers_on_a_closed_stream_is_stream_closed(peer: Peer) -> None:
    await peer.expect_served(1)
    peer.headers(1, end_stream=True)
    await peer.expect_goaway(ErrorCode.STREAM_CLOSED)


async def test_5_1_13_continuation_on_a_closed_stream_is_a_protocol_error(peer: Peer) -> None:
    await peer.expect_served(1)
    peer.send(CONTINUATION, END_HEADERS, 1, b"\x88")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_5_1_frames_in_flight_after_epp_reset_the_stream_are_ignored(peer: Peer) -> None:
    """EPP ended stream 1 before the client did (an unknown method), resetting it with NO_ERROR: the client's
    frames already under way for it are dropped (§5.1 'closed') and the connection goes on."""
    peer.headers(1, [(k, b"/other.Service/Method" if k == b":path" else v) for k, v in GRPC])
    await peer.read_until(lambda f: f.kind == RST_STREAM and f.stream == 1 and f.error_code == 0, "RST_STREAM NO_ERROR")
    peer.send(DATA, 0, 1, b"in flight")
    peer.headers(1, [(b"x-trailer", b"1")], end_stream=True)
    peer.send(WINDOW_UPDATE, 0, 1, b"\x00\x00\x01\x00")
    assert not [f for f in await peer.expect_alive() if f.kind in (RST_STREAM, GOAWAY)]
    await peer.expect_served(3)


async def test_5_1_1_1_an_even_stream_id_is_a_protocol_error(peer: Peer) -> None:
    peer.headers(2, end_stream=True)
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_5_1_1_2_a_lower_stream_id_than_before_is_a_protocol_error(peer: Peer) -> None:
    await peer.expect_served(5)
    peer.headers(3, end_stream=True)
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_5_1_2_1_streams_beyond_max_concurrent_streams_are_refused() -> None:
    server = await start_server(H2Limits(max_concurrent_streams=2))
    peer = await Peer.connect(server_port(server))
    assert peer.server_settings[0x3] == 2
    peer.headers(1)
    peer.headers(3)
    peer.headers(5)
    await peer.expect_rst(5, ErrorCode.REFUSED_STREAM)
    assert not [f for f in peer.seen if f.kind == RST_STREAM and f.stream in (1, 3)]
    peer.send(RST_STREAM, 0, 1, (ErrorCode.CANCEL).to_bytes(4, "big"))
    await peer.expect_served(7)  # a slot freed: the next stream is served
    await peer.close()
    await server.stop(0)


# -- 5.3 priority, 5.4 error handling, 5.5 extensions -----------------------------------------------------------

async def test_5_3_1_1_headers_depending_on_its_own_stream_is_a_stream_error(peer: Peer) -> None:
    peer.send(HEADERS, END_HEADERS | END_STREAM | PRIORITY_FLAG, 1, b"\x00\x00\x00\x01\x10" + peer.block())
    await peer.expect_rst(1, ErrorCode.PROTOCOL_ERROR)


async def test_5_3_1_2_priority_depending_on_its_own_stream_is_a_stream_error(peer: Peer) -> None:
    peer.headers(1)
    peer.send(PRIORITY, 0, 1, b"\x00\x00\x00\x01\x10")
    await peer.expect_rst(1, ErrorCode.PROTOCOL_ERROR)


async def test_5_3_priority_on_an_idle_stream_is_accepted(peer: Peer) -> None:
    peer.send(PRIORITY, 0, 9, b"\x00\x00\x00\x00\x10")
    await peer.expect_alive()
    await peer.expect_served(9)


async def test_5_4_1_a_connection_error_sends_goaway_naming_the_last_stream_then_closes(peer: Peer) -> None:
    await peer.expect_served(1)
    peer.send(PING, 0, 0, b"short")
    goaway = await peer.expect_goaway(ErrorCode.FRAME_SIZE_ERROR)
    assert goaway.last_stream == 1


async def test_5_5_1_an_unknown_extension_frame_is_ignored(peer: Peer) -> None:
    peer.send(0x16, 0x1, 1, b"extension")
    await peer.expect_alive()


async def test_5_5_2_an_unknown_frame_inside_a_header_block_is_a_protocol_error(peer: Peer) -> None:
    peer.send(HEADERS, END_STREAM, 1, peer.block())
    peer.send(0x16, 0, 1, b"extension")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


# -- 6.1 DATA, 6.2 HEADERS, 6.3 PRIORITY, 6.4 RST_STREAM --------------------------------------------------------

async def test_6_1_1_data_on_stream_0_is_a_protocol_error(peer: Peer) -> None:
    peer.send(DATA, 0, 0, b"x")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_1_2_data_on_a_stream_both_sides_ended_is_stream_closed(peer: Peer) -> None:
    peer.headers(1, end_stream=True)  # EPP answers at once: the stream is closed when the DATA arrives
    peer.send(DATA, 0, 1, b"x")
    await peer.expect_goaway(ErrorCode.STREAM_CLOSED)


async def test_6_1_3_data_with_a_bad_pad_length_is_a_protocol_error(peer: Peer) -> None:
    peer.headers(1)
    peer.send(DATA, PADDED, 1, b"\x06abcde")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_1_padded_data_is_unpadded(peer: Peer) -> None:
    peer.headers(1)
    body = grpc_frame(request_headers("/v1/models", eos=True))
    peer.send(DATA, PADDED | END_STREAM, 1, b"\x03" + body + b"\x00\x00\x00")
    end = await peer.response(1)
    assert list(hpack.Decoder().decode(end.payload))[-1] == ("grpc-status", "0")


async def test_6_2_1_priority_after_headers_without_end_headers_is_a_protocol_error(peer: Peer) -> None:
    peer.send(HEADERS, 0, 1, peer.block())
    peer.send(PRIORITY, 0, 3, b"\x00\x00\x00\x00\x10")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_2_2_headers_to_another_stream_after_headers_without_end_headers(peer: Peer) -> None:
    peer.send(HEADERS, 0, 1, peer.block())
    peer.send(HEADERS, END_HEADERS, 3, b"\x88")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_2_3_headers_on_stream_0_is_a_protocol_error(peer: Peer) -> None:
    peer.send(HEADERS, END_HEADERS | END_STREAM, 0, peer.block())
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_2_4_headers_with_a_bad_pad_length_is_a_protocol_error(peer: Peer) -> None:
    block = peer.block()
    peer.send(HEADERS, END_HEADERS | PADDED, 1, bytes([len(block) + 1]) + block)
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_3_1_priority_on_stream_0_is_a_protocol_error(peer: Peer) -> None:
    peer.send(PRIORITY, 0, 0, b"\x00\x00\x00\x01\x10")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_3_2_priority_of_a_wrong_length_is_a_stream_frame_size_error(peer: Peer) -> None:
    peer.headers(1)
    peer.send(PRIORITY, 0, 1, b"\x00\x00\x00\x00")
    await peer.expect_rst(1, ErrorCode.FRAME_SIZE_ERROR)


async def test_6_4_1_rst_stream_on_stream_0_is_a_protocol_error(peer: Peer) -> None:
    peer.send(RST_STREAM, 0, 0, b"\x00\x00\x00\x08")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_4_2_rst_stream_on_an_idle_stream_is_a_protocol_error(peer: Peer) -> None:
    await peer.expect_served(1)
    peer.send(RST_STREAM, 0, 3, b"\x00\x00\x00\x08")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_4_3_rst_stream_of_a_wrong_length_is_a_frame_size_error(peer: Peer) -> None:
    peer.headers(1)
    peer.send(RST_STREAM, 0, 1, b"\x00\x00\x00\x00\x08")
    await peer.expect_goaway(ErrorCode.FRAME_SIZE_ERROR)


# -- 6.5 SETTINGS -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, stream, payload, code", [
    (ACK, 0, b"\x00\x04\x00\x00\x00\x01", ErrorCode.FRAME_SIZE_ERROR),
    (0, 1, b"", ErrorCode.PROTOCOL_ERROR),
    (0, 0, b"\x00\x04\x00\x00\x00", ErrorCode.FRAME_SIZE_ERROR),
    (0, 0, struct.pack(">HL", ENABLE_PUSH, 2), ErrorCode.PROTOCOL_ERROR),
    (0, 0, struct.pack(">HL", INITIAL_WINDOW_SIZE, 1 << 31), ErrorCode.FLOW_CONTROL_ERROR),
    (0, 0, struct.pack(">HL", MAX_FRAME_SIZE, 16383), ErrorCode.PROTOCOL_ERROR),
    (0, 0, struct.pack(">HL", MAX_FRAME_SIZE, 1 << 24), ErrorCode.PROTOCOL_ERROR),
], ids=["6.5.1-ack-with-payload", "6.5.2-on-a-stream", "6.5.3-length-not-multiple-of-6", "6.5.2.1-enable-push-2",
        "6.5.2.2-initial-window-above-max", "6.5.2.3-max-frame-below-initial", "6.5.2.4-max-frame-above-max"])
async def test_6_5_bad_settings_are_connection_errors(peer: Peer, flags: int, stream: int, payload: bytes,
                                                      code: int) -> None:
    peer.send(SETTINGS, flags, stream, payload)
    await peer.expect_goaway(code)


async def test_6_5_2_5_an_unknown_setting_is_ignored_and_acknowledged(peer: Peer) -> None:
    peer.send(SETTINGS, 0, 0, struct.pack(">HL", 0xFF, 1))
    await peer.read_until(lambda f: f.kind == SETTINGS and f.flags & ACK, "SETTINGS ACK")
    await peer.expect_served(1)


async def test_6_5_3_1_the_last_of_repeated_values_applies(port: int) -> None:
    peer = await Peer.connect(port)
    peer.send(SETTINGS, 0, 0, struct.pack(">HLHL", INITIAL_WINDOW_SIZE, 100, INITIAL_WINDOW_SIZE, 1))
    await peer.read_until(lambda f: f.kind == SETTINGS and f.flags & ACK, "SETTINGS ACK")
    peer.headers(1)
    peer.send(DATA, END_STREAM, 1, grpc_frame(request_headers("/v1/models", eos=True)))
    data = await peer.read_until(lambda f: f.kind == DATA and f.stream == 1, "DATA on stream 1")
    assert len(data.payload) == 1


async def test_6_5_3_2_settings_are_acknowledged(peer: Peer) -> None:
    peer.send(SETTINGS, 0, 0, struct.pack(">HL", INITIAL_WINDOW_SIZE, 70000))
    ack = await peer.read_until(lambda f: f.kind == SETTINGS and f.flags & ACK, "SETTINGS ACK")
    assert ack.payload == b""


# -- 6.7 PING, 6.8 GOAWAY ---------------------------------------------------------------------------------------

async def test_6_7_1_ping_is_answered_with_the_same_payload(peer: Peer) -> None:
    peer.send(PING, 0, 0, b"\x01\x02\x03\x04\x05\x06\x07\x08")
    ack = await peer.read_until(lambda f: f.kind == PING, "PING ACK")
    assert ack.flags == ACK and ack.payload == b"\x01\x02\x03\x04\x05\x06\x07\x08"


async def test_6_7_2_a_ping_ack_is_not_answered(peer: Peer) -> None:
    peer.send(PING, ACK, 0, b"unasked!")
    before = await peer.expect_alive()
    assert not [f for f in before if f.kind == PING]


async def test_6_7_3_ping_on_a_stream_is_a_protocol_error(peer: Peer) -> None:
    peer.send(PING, 0, 1, b"12345678")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_7_4_ping_of_a_wrong_length_is_a_frame_size_error(peer: Peer) -> None:
    peer.send(PING, 0, 0, b"123456")
    await peer.expect_goaway(ErrorCode.FRAME_SIZE_ERROR)


async def test_6_8_1_goaway_on_a_stream_is_a_protocol_error(peer: Peer) -> None:
    peer.send(GOAWAY, 0, 1, b"\x00\x00\x00\x00\x00\x00\x00\x00")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_8_a_client_goaway_closes_the_connection_once_its_streams_end(peer: Peer) -> None:
    peer.send(GOAWAY, 0, 0, b"\x00\x00\x00\x00\x00\x00\x00\x00")
    while (got := await peer.next()) is not None:
        assert got.kind in (SETTINGS, WINDOW_UPDATE), got  # what the handshake left unread, then the close


# -- 6.9 WINDOW_UPDATE and flow control -------------------------------------------------------------------------

async def test_6_9_1_window_update_of_0_on_the_connection_is_a_protocol_error(peer: Peer) -> None:
    peer.send(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_9_2_window_update_of_0_on_a_stream_is_a_stream_error(peer: Peer) -> None:
    peer.headers(1)
    peer.send(WINDOW_UPDATE, 0, 1, b"\x00\x00\x00\x00")
    await peer.expect_rst(1, ErrorCode.PROTOCOL_ERROR)


async def test_6_9_3_window_update_of_a_wrong_length_is_a_frame_size_error(peer: Peer) -> None:
    peer.send(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x01\x00")
    await peer.expect_goaway(ErrorCode.FRAME_SIZE_ERROR)


async def test_6_9_1_1_an_initial_window_of_1_gets_data_one_byte_at_a_time(port: int) -> None:
    peer = await Peer.connect(port, {INITIAL_WINDOW_SIZE: 1})
    peer.headers(1)
    peer.send(DATA, END_STREAM, 1, grpc_frame(request_headers("/v1/models", eos=True)))
    data = await peer.read_until(lambda f: f.kind == DATA and f.stream == 1, "DATA on stream 1")
    assert len(data.payload) == 1
    assert not [f for f in await peer.expect_alive() if f.kind == DATA]


async def test_6_9_1_2_connection_window_overflow_is_a_flow_control_error(peer: Peer) -> None:
    peer.send(WINDOW_UPDATE, 0, 0, (0x7FFFFFFF).to_bytes(4, "big"))
    await peer.expect_goaway(ErrorCode.FLOW_CONTROL_ERROR)


async def test_6_9_1_3_stream_window_overflow_is_a_stream_flow_control_error(peer: Peer) -> None:
    peer.headers(1)
    peer.send(WINDOW_UPDATE, 0, 1, (0x7FFFFFFF).to_bytes(4, "big"))
    await peer.expect_rst(1, ErrorCode.FLOW_CONTROL_ERROR)


async def test_6_9_2_1_a_larger_initial_window_after_headers_releases_data(port: int) -> None:
    peer = await Peer.connect(port, {INITIAL_WINDOW_SIZE: 0})
    peer.headers(1)
    peer.send(DATA, END_STREAM, 1, grpc_frame(request_headers("/v1/models", eos=True)))
    await peer.read_until(lambda f: f.kind == HEADERS and f.stream == 1, "response headers")
    peer.send(SETTINGS, 0, 0, struct.pack(">HL", INITIAL_WINDOW_SIZE, 1))
    data = await peer.read_until(lambda f: f.kind == DATA and f.stream == 1, "DATA on stream 1")
    assert len(data.payload) == 1


async def test_6_9_2_2_a_negative_window_holds_data_until_it_is_positive(port: int) -> None:
    peer = await Peer.connect(port, {INITIAL_WINDOW_SIZE: 5})
    peer.headers(1)
    peer.send(DATA, END_STREAM, 1, grpc_frame(request_headers("/v1/models", eos=True)))
    first = await peer.read_until(lambda f: f.kind == DATA and f.stream == 1, "DATA on stream 1")
    assert len(first.payload) == 5
    peer.send(SETTINGS, 0, 0, struct.pack(">HL", INITIAL_WINDOW_SIZE, 2))  # the stream's window is now -3
    peer.send(WINDOW_UPDATE, 0, 1, (3).to_bytes(4, "big"))  # 0: still nothing may be sent
    assert not [f for f in await peer.expect_alive() if f.kind == DATA]
    peer.send(WINDOW_UPDATE, 0, 1, (1).to_bytes(4, "big"))
    data = await peer.read_until(lambda f: f.kind == DATA and f.stream == 1, "DATA on stream 1")
    assert len(data.payload) == 1


async def test_6_9_2_3_an_initial_window_above_the_maximum_is_a_flow_control_error(peer: Peer) -> None:
    peer.send(SETTINGS, 0, 0, struct.pack(">HL", INITIAL_WINDOW_SIZE, 1 << 31))
    await peer.expect_goaway(ErrorCode.FLOW_CONTROL_ERROR)


async def test_6_9_data_beyond_the_stream_window_is_a_stream_flow_control_error() -> None:
    server = await start_server(H2Limits(initial_stream_window=16384))
    peer = await Peer.connect(server_port(server))
    peer.headers(1)
    peer.send(DATA, 0, 1, b"\x00" + (100_000).to_bytes(4, "big") + b"x" * 16380)  # 16385 bytes
    await peer.expect_rst(1, ErrorCode.FLOW_CONTROL_ERROR)
    await peer.expect_served(3)
    await peer.close()
    await server.stop(0)


async def test_6_9_data_beyond_the_connection_window_is_a_flow_control_error() -> None:
    server = await start_server(H2Limits(initial_stream_window=1 << 20, initial_connection_window=65535))
    peer = await Peer.connect(server_port(server))
    peer.headers(1)
    peer.send(DATA, 0, 1, b"\x00" + (900_000).to_bytes(4, "big") + b"x" * 65531)  # 65536 bytes
    await peer.expect_goaway(ErrorCode.FLOW_CONTROL_ERROR)
    await server.stop(0)


# -- 6.10 CONTINUATION ------------------------------------------------------------------------------------------

async def test_6_10_1_a_header_block_split_over_continuations_is_accepted(peer: Peer) -> None:
    block = peer.block()
    peer.send(HEADERS, END_STREAM, 1, block[:3])
    peer.send(CONTINUATION, 0, 1, block[3:6])
    peer.send(CONTINUATION, END_HEADERS, 1, block[6:])
    await peer.response(1)


async def test_6_10_2_continuation_followed_by_another_frame_is_a_protocol_error(peer: Peer) -> None:
    block = peer.block()
    peer.send(HEADERS, END_STREAM, 1, block[:3])
    peer.send(CONTINUATION, 0, 1, block[3:])
    peer.send(DATA, 0, 1, b"x")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_10_3_continuation_on_stream_0_is_a_protocol_error(peer: Peer) -> None:
    block = peer.block()
    peer.send(HEADERS, END_STREAM, 1, block[:3])
    peer.send(CONTINUATION, END_HEADERS, 0, block[3:])
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_10_4_continuation_after_end_headers_is_a_protocol_error(peer: Peer) -> None:
    peer.send(HEADERS, END_HEADERS, 1, peer.block())
    peer.send(CONTINUATION, END_HEADERS, 1, peer.block([(b"x-more", b"1")]))
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_10_5_continuation_after_a_final_continuation_is_a_protocol_error(peer: Peer) -> None:
    block = peer.block()
    peer.send(HEADERS, 0, 1, block[:3])
    peer.send(CONTINUATION, END_HEADERS, 1, block[3:])
    peer.send(CONTINUATION, END_HEADERS, 1, peer.block([(b"x-more", b"1")]))
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


async def test_6_10_6_continuation_after_data_is_a_protocol_error(peer: Peer) -> None:
    peer.headers(1)
    peer.send(DATA, 0, 1, b"\x00\x00\x00\x00\x20")
    peer.send(CONTINUATION, END_HEADERS, 1, b"\x88")
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


# -- 8.1 HTTP request framing and header fields -----------------------------------------------------------------

async def test_8_1_1_a_second_headers_without_end_stream_is_a_stream_error(peer: Peer) -> None:
    peer.headers(1)
    peer.headers(1, [(b"x-trailer", b"1")])
    await peer.expect_rst(1, ErrorCode.PROTOCOL_ERROR)


def replaced(name: bytes, value: bytes | None) -> list[tuple[bytes, bytes]]:
    """GRPC headers with ``name`` set to ``value`` (None: removed)."""
    fields = [(k, v) for k, v in GRPC if k != name]
    return fields if value is None else fields[:2] + [(name, value)] + fields[2:]


MALFORMED = {
    "8.1.2-uppercase-name": GRPC + [(b"X-Upper", b"1")],
    "8.1.2.1.1-unknown-pseudo": [(b":unknown", b"1")] + GRPC,
    "8.1.2.1.2-response-pseudo": [(b":status", b"200")] + GRPC,
    "8.1.2.1.4-pseudo-after-regular": GRPC + [(b":authority", b"late")],
    "8.1.2.2.1-connection-header": GRPC + [(b"connection", b"keep-alive")],
    "8.1.2.2.2-te-not-trailers": [(k, b"gzip" if k == b"te" else v) for k, v in GRPC],
    "8.1.2.3.1-empty-path": replaced(b":path", b""),
    "8.1.2.3.2-no-method": replaced(b":method", None),
    "8.1.2.3.3-no-scheme": replaced(b":scheme", None),
    "8.1.2.3.4-no-path": replaced(b":path", None),
    "8.1.2.3.5-duplicated-method": [(b":method", b"POST")] + GRPC,
    "8.1.2.3.6-duplicated-scheme": [(b":scheme", b"http")] + GRPC,
    "8.1.2.3.7-duplicated-path": [(b":path", b"/x")] + GRPC,
}


@pytest.mark.parametrize("fields", list(MALFORMED.values()), ids=list(MALFORMED))
async def test_8_1_2_malformed_requests_are_stream_protocol_errors(peer: Peer,
                                                                   fields: list[tuple[bytes, bytes]]) -> None:
    peer.headers(1, fields, end_stream=True)
    await peer.expect_rst(1, ErrorCode.PROTOCOL_ERROR)
    await peer.expect_served(3)


async def test_8_1_2_1_3_a_pseudo_header_in_trailers_is_a_stream_error(peer: Peer) -> None:
    peer.headers(1)
    peer.headers(1, [(b":path", b"/late")], end_stream=True)
    await peer.expect_rst(1, ErrorCode.PROTOCOL_ERROR)


async def test_8_1_2_6_1_content_length_not_matching_data_is_a_stream_error(peer: Peer) -> None:
    peer.headers(1, GRPC + [(b"content-length", b"10")])
    peer.send(DATA, END_STREAM, 1, b"\x00\x00\x00\x00\x00")
    await peer.expect_rst(1, ErrorCode.PROTOCOL_ERROR)


async def test_8_1_2_6_2_content_length_not_matching_the_sum_of_data_is_a_stream_error(peer: Peer) -> None:
    peer.headers(1, GRPC + [(b"content-length", b"12")])
    peer.send(DATA, 0, 1, b"\x00\x00\x00\x00\x10")  # a message of 16 bytes, still incomplete
    peer.send(DATA, END_STREAM, 1, b"\x00\x00\x00\x00\x00")
    await peer.expect_rst(1, ErrorCode.PROTOCOL_ERROR)


async def test_8_1_a_matching_content_length_is_accepted(peer: Peer) -> None:
    body = grpc_frame(request_headers("/v1/models", eos=True))
    peer.headers(1, GRPC + [(b"content-length", str(len(body)).encode())])
    peer.send(DATA, END_STREAM, 1, body)
    await peer.response(1)


async def test_8_2_1_push_promise_from_a_client_is_a_protocol_error(peer: Peer) -> None:
    peer.headers(1)
    peer.send(PUSH_PROMISE, END_HEADERS, 1, b"\x00\x00\x00\x02" + peer.block())
    await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)


# -- HPACK (RFC 7541) -------------------------------------------------------------------------------------------

HPACK_BAD = {
    "2.3.3.1-index-beyond-tables": b"\xff\x0f",  # indexed field 62+15 with an empty dynamic table
    "2.3.3.2-literal-name-index-beyond-tables": b"\x0f\x40\x01a",  # literal without indexing, name index 79
    "4.2.1-table-size-update-after-a-field": b"\x82\x20",
    "5.2.1-huffman-padding-over-7-bits": b"\x00\x03x-a\x82\x1f\xff",  # 'a', then 11 bits of padding
    "5.2.2-huffman-padded-with-zeros": b"\x00\x03x-a\x81\x18",  # 'a' padded with 000
    "5.2.3-huffman-with-eos": b"\x00\x03x-a\x84\xff\xff\xff\xff",  # the 30-bit EOS code
    "6.1.1-index-0": b"\x80",
    "6.3.1-table-size-update-above-the-setting": b"\x3f\xe2\x1f",  # 4097
}


@pytest.mark.parametrize("bad", list(HPACK_BAD.values()), ids=list(HPACK_BAD))
async def test_hpack_bad_representations_are_compression_errors(peer: Peer, bad: bytes) -> None:
    """Each bad representation comes after a valid request's fields (built without the dynamic table)."""
    valid = hpack.Encoder()
    valid.header_table_size = 0
    block = bad + valid.encode(GRPC) if bad[0] & 0xE0 == 0x20 and bad != b"\x82\x20" else valid.encode(GRPC) + bad
    peer.send(HEADERS, END_HEADERS | END_STREAM, 1, block)
    await peer.expect_goaway(ErrorCode.COMPRESSION_ERROR)


async def test_hpack_4_2_a_table_size_update_at_the_start_of_a_block_is_accepted(peer: Peer) -> None:
    encoder = hpack.Encoder()
    encoder.header_table_size = 256  # the next block opens with a size update
    peer.send(HEADERS, END_HEADERS | END_STREAM, 1, encoder.encode(GRPC))
    await peer.response(1)

