"""What a hostile HTTP/2 peer can make EPP's own transport hold or do is bounded (``H2Limits``): bytes by the
receive windows and the connection budget, streams by SETTINGS_MAX_CONCURRENT_STREAMS, queued output by the
outbound frame limits and ``pause_writing``, floods by Envoy's limits (GOAWAY ENHANCE_YOUR_CALM), header blocks
before they are decoded, and silent or idle connections by timeouts. Well-behaved calls keep working throughout.

Timeouts are made small through ``H2Limits``; the tests wait for outcomes with deadlines, never for durations."""

from __future__ import annotations

import asyncio
import os
import socket
import struct

import h2.config
import h2.connection
import h2.events
import pytest

from epp.extproc.h2.connection import ErrorCode, H2Connection, H2Limits
from epp.extproc.h2.server import NativeServer
from epp.extproc.protocol import pb

from ..conftest import eventually
from .helpers import CHAT, request_body, request_headers
from .test_h2_conformance import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    GRPC,
    HEADERS,
    PING,
    PREFACE,
    PRIORITY,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Peer,
    frame,
    grpc_frame,
    server_port,
    start_server,
)

CALM = ErrorCode.ENHANCE_YOUR_CALM


def connection(server: NativeServer) -> H2Connection:
    assert len(server.connections) == 1
    return next(iter(server.connections))


class FlowClient:
    """An ``h2`` client that obeys flow control: it sends only what EPP's windows allow, waiting for more."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.changed = asyncio.Event()
        self.ended: dict[int, dict[str, str]] = {}
        self.data: dict[int, bytearray] = {}
        self.closed = False
        self.acks: set[bytes] = set()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, port: int) -> FlowClient:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        client.conn.initiate_connection()
        client.flush()
        client._task = asyncio.create_task(client._read())
        await client.round_trip()  # EPP's SETTINGS and first WINDOW_UPDATE came before the PING's answer
        return client

    def flush(self) -> None:
        if data := self.conn.data_to_send():
            self.writer.write(data)

    async def _read(self) -> None:
        while data := await self.reader.read(1 << 16):
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    self.data.setdefault(event.stream_id, bytearray()).extend(event.data)
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived) and event.stream_ended:
                    self.ended[event.stream_id] = {str(k): str(v) for k, v in event.headers}  # str: utf-8 set
                elif isinstance(event, h2.events.PingAckReceived):
                    self.acks.add(event.ping_data)
            self.flush()
            self.changed.set()
        self.closed = True
        self.changed.set()

    def open(self) -> int:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(k.decode(), v.decode()) for k, v in GRPC])
        self.flush()
        return sid

    def push(self, sid: int, data: memoryview) -> int:
        """Send as much of ``data`` as the windows allow now; returns the bytes sent."""
        room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size, len(data))
        if room > 0:
            self.conn.send_data(sid, bytes(data[:room]))
            self.flush()
        return max(room, 0)

    async def send(self, sid: int, data: bytes, end: bool = True) -> None:
        view = memoryview(data)
        while view:
            sent = self.push(sid, view)
            view = view[sent:]
            if not sent:
                self.changed.clear()
                await asyncio.wait_for(self.changed.wait(), 10)  # a WINDOW_UPDATE (or the end)
                assert not self.closed
        if end:
            self.conn.end_stream(sid)
            self.flush()

    async def round_trip(self) -> None:
        """Everything EPP sent in answer to what went before has been processed (a PING answered)."""
        token = os.urandom(8)
        self.conn.ping(token)
        self.flush()
        await eventually(lambda: self.closed or token in self.acks, "PING ACK")

    async def close(self) -> None:
        self.writer.close()
        if self._task is not None:
            self._task.cancel()


async def served_elsewhere(server: NativeServer) -> None:
    """A well-behaved call on a new connection gets its answer."""
    peer = await Peer.connect(server_port(server))
    peer.headers(1)
    peer.send(DATA, END_STREAM, 1, grpc_frame(request_headers()) + grpc_frame(request_body(CHAT)))
    end = await peer.response(1)
    assert end.stream == 1
    await peer.close()


# -- receive windows ---------------------------------------------------------------------------------------------

SMALL = H2Limits(initial_stream_window=64 << 10, initial_connection_window=256 << 10, connection_buffer=2 << 20)


async def test_messages_that_never_complete_hold_at_most_the_connection_budget() -> None:
    """20 streams each announce a 1 MiB message and send what the windows allow, never finishing it: EPP lets in
    one message's reservation and the streams' windows, never more than the connection budget (20 MiB unbounded);
    a call on another connection is still served."""
    server = await start_server(SMALL, max_recv=1 << 20)
    client = await FlowClient.connect(server_port(server))
    size = (1 << 20) - 5
    streams = {client.open(): memoryview(b"\x00" + size.to_bytes(4, "big") + b"x" * (size - 1)) for _ in range(20)}
    sent = progress = 1
    while progress:  # send what the windows allow; after a round trip any WINDOW_UPDATE it earned is in
        progress = 0
        for sid, rest in streams.items():
            while (n := client.push(sid, rest)) > 0:
                rest = rest[n:]
                progress += n
            streams[sid] = rest
        sent += progress
        await client.round_trip()
    sent -= 1
    conn = connection(server)
    budget = server.limits.connection_buffer
    assert 1 << 20 < sent <= budget, (sent, budget)
    assert conn.windows.buffered <= budget
    await served_elsewhere(server)
    await client.close()
    await server.stop(0)


async def test_messages_larger_than_the_stream_window_pass_together_within_the_budget() -> None:
    """Five 600 KB messages at once on one connection (each above the 64 KiB stream window, together above the
    2 MiB budget): reservations are granted in turn and every call completes."""
    server = await start_server(SMALL, max_recv=1 << 20)
    client = await FlowClient.connect(server_port(server))
    big = b'{"model":"m","prompt":"' + b"x" * 600_000 + b'"}'
    message = grpc_frame(request_headers("/v1/completions")) + grpc_frame(request_body(big))
    sids = [client.open() for _ in range(5)]
    await asyncio.gather(*(client.send(sid, message) for sid in sids))
    await eventually(lambda: all(sid in client.ended for sid in sids), "every call answered")
    assert all(client.ended[sid]["grpc-status"] == "0" for sid in sids)
    for sid in sids:
        replies, data, pos = [], bytes(client.data[sid]), 0
        while pos < len(data):
            n = int.from_bytes(data[pos + 1:pos + 5], "big")
            replies.append(pb.ProcessingResponse.FromString(data[pos + 5:pos + 5 + n]))
            pos += 5 + n
        body = b"".join(r.request_body.response.body_mutation.streamed_response.body for r in replies[1:])
        assert body == big
    conn = connection(server)
    assert conn.windows.buffered == 0 and conn.windows.reserved == 0 and not conn.windows.waiting
    await client.close()
    await server.stop(0)


# -- concurrency -------------------------------------------------------------------------------------------------

async def test_streams_beyond_the_limit_are_refused_and_a_peer_that_keeps_on_is_cut_off() -> None:
    server = await start_server(H2Limits(max_concurrent_streams=4))
    peer = await Peer.connect(server_port(server))
    for sid in (1, 3, 5, 7):
        peer.headers(sid)
    peer.headers(9)
    await peer.expect_rst(9, ErrorCode.REFUSED_STREAM)
    assert connection(server).streams.keys() == {1, 3, 5, 7}
    for sid in range(11, 11 + 2 * 4, 2):  # four refusals in all are tolerated; the fifth is not
        peer.headers(sid)
    await peer.expect_goaway(CALM)
    await served_elsewhere(server)
    await server.stop(0)


# -- streams reset before they are answered (Rapid Reset, CVE-2023-44487) ----------------------------------------

RESETS = H2Limits(premature_reset_total_stream_count=20)
CANCEL = (8).to_bytes(4, "big")
ROUTING = grpc_frame(request_headers()) + grpc_frame(request_body(CHAT))  # a whole routing request, stream left open


def reset_calls(peer: Peer, first: int, count: int) -> int:
    """``count`` calls from stream ``first`` on, each sent and reset in one write (before EPP can answer); returns
    the next stream id."""
    sids = range(first, first + 2 * count, 2)
    peer.write(b"".join(frame(HEADERS, END_HEADERS, sid, peer.block()) + frame(DATA, 0, sid, ROUTING)
                        + frame(RST_STREAM, 0, sid, CANCEL) for sid in sids))
    return first + 2 * count


async def test_a_peer_resetting_its_calls_before_they_are_answered_is_cut_off() -> None:
    """Each reset frees its concurrency slot, so only the share of premature resets bounds the routings one
    connection makes EPP do; the check waits for premature_reset_total_stream_count closed streams."""
    server = await start_server(RESETS)
    peer = await Peer.connect(server_port(server))
    sid = reset_calls(peer, 1, 19)
    await peer.expect_alive()  # 19 closed streams: below the count the check waits for
    reset_calls(peer, sid, 1)
    goaway = await peer.expect_goaway(CALM)
    assert goaway.last_stream == sid
    await served_elsewhere(server)
    await server.stop(0)


async def test_premature_resets_must_be_more_than_half_of_the_closed_streams() -> None:
    server = await start_server(RESETS)
    peer = await Peer.connect(server_port(server))
    sid = 1
    for _ in range(10):
        await peer.expect_served(sid)
        sid += 2
    sid = reset_calls(peer, sid, 10)
    await peer.expect_alive()  # 10 of 20: half is tolerated, as in Envoy
    reset_calls(peer, sid, 1)
    await peer.expect_goaway(CALM)  # 11 of 21
    await server.stop(0)


async def test_resets_after_epp_answered_do_not_count() -> None:
    """Envoy resets each ext_proc stream right after EPP's answer when the route's response mode is none: a
    connection carrying only such streams stays up."""
    server = await start_server(RESETS)
    peer = await Peer.connect(server_port(server))
    for sid in range(1, 1 + 2 * 40, 2):
        peer.headers(sid)
        peer.send(DATA, 0, sid, ROUTING)
        await peer.read_until(lambda f, sid=sid: f.kind == HEADERS and f.stream == sid, f"the answer on {sid}")
        peer.send(RST_STREAM, 0, sid, CANCEL)
    await peer.expect_alive()
    await peer.expect_served(81)
    await server.stop(0)


async def test_resets_of_streams_older_than_the_premature_lifetime_do_not_count() -> None:
    """Calls EPP held (say, queued by flow control) that their clients gave up on are not an attack."""
    server = await start_server(H2Limits(premature_reset_total_stream_count=20,
                                         premature_reset_min_stream_lifetime=0.05))
    peer = await Peer.connect(server_port(server))
    sids = range(1, 1 + 2 * 40, 2)
    for sid in sids:
        peer.headers(sid)  # no message: EPP never answers
    await peer.expect_alive()
    await asyncio.sleep(0.1)
    peer.write(b"".join(frame(RST_STREAM, 0, sid, CANCEL) for sid in sids))
    await peer.expect_alive()
    await server.stop(0)


# -- output a peer does not read ---------------------------------------------------------------------------------

async def test_a_peer_that_floods_pings_and_never_reads_is_cut_off_with_bounded_output() -> None:
    """With the frame-count limits out of the way: EPP's acknowledgements fill the socket, writing pauses, reading
    stops, and the connection is aborted after the write timeout; EPP's queued output stays bounded all along by
    the transport's high-water mark plus one read's worth of frames (it grew by 142 MB before)."""
    server = await start_server(H2Limits(write_timeout=1.0, max_outbound_frames=1 << 30,
                                         max_outbound_control_frames=1 << 30))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that reads nothing fills up fast
    sock.connect(("127.0.0.1", server_port(server)))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(PREFACE + frame(SETTINGS, 0, 0))
    burst = frame(PING, 0, 0, b"flooding") * 400
    await eventually(lambda: len(server.connections) == 1, "the connection accepted")
    conn = connection(server)
    most = queued = 0
    paused = False
    loop = asyncio.get_running_loop()
    end = loop.time() + 60
    while server.connections:
        assert loop.time() < end, "the flooding connection was never closed"
        if conn.transport is not None:
            most = max(most, conn.transport.get_write_buffer_size())
            queued = max(queued, len(conn._out))
            paused = paused or conn._paused
        if writer.transport.get_write_buffer_size() < 1 << 20:
            writer.write(burst)
        await asyncio.sleep(0.002)
    assert paused
    assert most <= 512 << 10, most  # the 64 KiB high-water mark plus what one flush can carry
    assert queued <= (256 << 10) // 17, queued  # one read (asyncio reads 256 KiB at most) of PINGs
    await served_elsewhere(server)
    writer.close()
    await server.stop(0)


async def test_a_burst_of_pings_beyond_the_control_frame_limit_is_enhance_your_calm() -> None:
    server = await start_server()
    peer = await Peer.connect(server_port(server))
    peer.write(frame(PING, 0, 0, b"12345678") * 1500)  # one read: 1,500 acknowledgements queued at once
    await peer.expect_goaway(CALM)
    await served_elsewhere(server)
    await server.stop(0)


# -- inbound floods ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("frames", [
    [frame(HEADERS, 0, 1, b"\x83")] + [frame(CONTINUATION, 0, 1)] * 3,
    [frame(HEADERS, 0, 1, b"\x83")] + [frame(CONTINUATION, 0, 1, b"\x86")] * 9,
    [frame(HEADERS, END_HEADERS, 1, b"\x83\x86\x84")] + [frame(DATA, 0, 1)] * 3,
    [frame(PRIORITY, 0, 3, b"\x00\x00\x00\x00\x10")] * 101,
    [frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x01")] * 6,
], ids=["empty-continuations", "continuations-beyond-8", "empty-data", "priority-beyond-100-per-stream",
        "window-updates-without-data-sent"])
async def test_inbound_floods_are_enhance_your_calm(frames: list[bytes]) -> None:
    """Envoy's limits: one empty frame, 8 CONTINUATIONs a block, 100 PRIORITY frames per answered stream (plus
    one stream's worth), 5 + 2 x (streams + 10 x DATA frames sent) WINDOW_UPDATEs."""
    server = await start_server()
    peer = await Peer.connect(server_port(server))
    peer.write(b"".join(frames))
    await peer.expect_goaway(CALM)
    await served_elsewhere(server)
    await server.stop(0)


async def test_a_header_block_above_the_list_limit_is_refused_before_decoding() -> None:
    """A 1 MB Huffman-coded value (its decoding cost 0.25 s of event loop) and a 20 KB block spread over
    CONTINUATION frames both end the connection at once."""
    server = await start_server()
    peer = await Peer.connect(server_port(server))
    huge = b"\x00\x03x-a\xff" + struct.pack("B", 0x80 | 0x7F) + b"\xff\xff\x3f" + b"\xaa" * (1 << 20)
    peer.send(HEADERS, END_HEADERS | END_STREAM, 1, huge[:1 << 20])
    await peer.expect_goaway(CALM)
    peer = await Peer.connect(server_port(server))
    block = peer.block(GRPC + [(b"x-big", b"v" * 20_000)])
    peer.send(HEADERS, END_STREAM, 1, block[:8000])
    peer.send(CONTINUATION, 0, 1, block[8000:16000])
    peer.send(CONTINUATION, END_HEADERS, 1, block[16000:])
    await peer.expect_goaway(CALM)
    await served_elsewhere(server)
    await server.stop(0)


# -- silent and idle connections ---------------------------------------------------------------------------------

@pytest.mark.parametrize("sent", [b"", PREFACE[:10], PREFACE], ids=["nothing", "part-of-the-preface",
                                                                    "preface-without-settings"])
async def test_a_connection_that_never_completes_the_preface_is_closed(sent: bytes) -> None:
    server = await start_server(H2Limits(preface_timeout=0.2))
    peer = await Peer.connect(server_port(server), handshake=False)
    peer.write(sent)
    goaway = await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)
    assert goaway.last_stream == 0
    await eventually(lambda: not server.connections, "the connection forgotten")
    await server.stop(0)


async def test_an_idle_connection_is_closed_gracefully_after_a_ping_round_trip() -> None:
    """No open stream for idle_timeout: GOAWAY naming the largest stream id (streams still welcome), PING; on its
    answer a GOAWAY naming the last stream served, then the close."""
    server = await start_server(H2Limits(idle_timeout=0.3))
    peer = await Peer.connect(server_port(server))
    await peer.expect_served(1)
    first = await peer.read_until(lambda f: f.kind == GOAWAY, "the announcing GOAWAY")
    assert first.error_code == ErrorCode.NO_ERROR and first.last_stream == (1 << 31) - 1
    ping = await peer.read_until(lambda f: f.kind == PING, "the closing PING")
    peer.send(PING, 0x1, 0, ping.payload)
    final = await peer.expect_goaway(ErrorCode.NO_ERROR)
    assert final.last_stream == 1
    await server.stop(0)


async def test_a_stream_opened_while_the_idle_close_is_announced_is_still_served() -> None:
    server = await start_server(H2Limits(idle_timeout=0.3))
    peer = await Peer.connect(server_port(server))
    await peer.read_until(lambda f: f.kind == GOAWAY, "the announcing GOAWAY")
    ping = await peer.read_until(lambda f: f.kind == PING, "the closing PING")
    await peer.expect_served(1)  # crossed the GOAWAY: still served
    peer.send(PING, 0x1, 0, ping.payload)
    final = await peer.expect_goaway(ErrorCode.NO_ERROR)
    assert final.last_stream == 1
    await server.stop(0)


async def test_an_idle_peer_that_never_answers_the_closing_ping_is_closed_all_the_same() -> None:
    server = await start_server(H2Limits(idle_timeout=0.2, write_timeout=0.3))
    peer = await Peer.connect(server_port(server))
    await peer.read_until(lambda f: f.kind == GOAWAY, "the announcing GOAWAY")
    await peer.read_until(lambda f: f.kind == PING, "the closing PING")
    final = await peer.expect_goaway(ErrorCode.NO_ERROR)
    assert final.last_stream == 0
    await eventually(lambda: not server.connections, "the connection forgotten")
    await server.stop(0)


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="initial_connection_window"):
        H2Limits(initial_connection_window=1000)
    with pytest.raises(ValueError, match="max_frame_size"):
        H2Limits(max_frame_size=1 << 24)
    with pytest.raises(ValueError, match="timeouts"):
        H2Limits(preface_timeout=0)
    assert H2Limits(idle_timeout=0).idle_timeout == 0  # 0 disables the idle close
    with pytest.raises(ValueError, match="premature-reset"):
        H2Limits(premature_reset_min_stream_lifetime=-1)
    with pytest.raises(ValueError, match="flood limits"):
        H2Limits(premature_reset_total_stream_count=0)


def test_serve_flags_set_the_limits() -> None:
    from epp.cli.main import build_parser
    from epp.cli.serve import options_from_args

    def options(*flags: str) -> H2Limits:
        args = build_parser().parse_args(["serve", "--endpoints", "e.yaml", *flags])
        return H2Limits(**options_from_args(args).h2_limits)

    assert options() == H2Limits()
    assert options("--grpc-preface-timeout", "2s", "--grpc-idle-timeout", "0", "--grpc-max-concurrent-streams",
                   "50") == H2Limits(preface_timeout=2.0, idle_timeout=0.0, max_concurrent_streams=50)
    with pytest.raises(SystemExit):
        options("--grpc-max-concurrent-streams", "0")


async def test_epp_serve_closes_a_preface_less_connection_at_its_flag(tmp_path) -> None:
    """``epp serve --grpc-preface-timeout 0.2``: the ext_proc port of a whole EppApp closes a silent client."""
    import dataclasses

    from epp.cli.main import build_parser
    from epp.cli.serve import options_from_args
    from epp.runtime.app import EppApp

    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text("endpoints:\n  - name: e\n    address: 127.0.0.1\n    port: 1\n")
    args = build_parser().parse_args(["serve", "--endpoints", str(endpoints), "--grpc-port", "0", "--host",
                                      "127.0.0.1", "--metrics-port", "-1", "--plaintext",
                                      "--grpc-preface-timeout", "0.2"])
    app = EppApp(dataclasses.replace(options_from_args(args), health_port=None))
    await app.start()
    try:
        peer = await Peer.connect(app.extproc.port, handshake=False)
        goaway = await peer.expect_goaway(ErrorCode.PROTOCOL_ERROR)
        assert goaway.last_stream == 0
    finally:
        await app.stop()
