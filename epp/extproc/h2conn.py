"""A small HTTP/2 server connection (RFC 9113) for EPP's gRPC front: framing, flow control, and nothing more.

:class:`H2Connection` is an :class:`asyncio.Protocol`. It checks the client preface, exchanges SETTINGS, answers
PING, honours GOAWAY and RST_STREAM, decodes header blocks (HEADERS + CONTINUATION) with
:class:`~epp.extproc.hpack_codec.Decoder`, and hands each stream's headers and data to a :class:`StreamApp`. What it
sends obeys the peer's flow-control windows and maximum frame size; what it receives is acknowledged with
WINDOW_UPDATE as the application consumes it, which is at once (the application buffers whole gRPC messages,
bounded by its own size limit). Server push, priorities and the extended CONNECT are not used.

Protocol errors end the connection with GOAWAY and the RFC's error code; the application sees every open stream
reset, so per-request state is always released.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from collections.abc import Callable
from typing import Protocol

from .hpack_codec import Decoder, HpackError

__all__ = ["ErrorCode", "H2Connection", "StreamApp"]

log = logging.getLogger("epp.extproc.h2")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HEAD = struct.Struct(">BHBBL")
_DATA, _HEADERS, _PRIORITY, _RST, _SETTINGS, _PUSH, _PING, _GOAWAY, _WINDOW, _CONTINUATION = range(10)
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
STREAM_WINDOW = 1 << 24
CONNECTION_WINDOW = 1 << 26
MAX_FRAME_IN = 1 << 20
_MAX_WINDOW = (1 << 31) - 1


class ErrorCode:
    """HTTP/2 error codes EPP sends."""

    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    COMPRESSION_ERROR = 9


class StreamApp(Protocol):
    """What runs on top of the connection: one call per stream."""

    def headers_received(self, conn: H2Connection, stream_id: int, headers: list[tuple[bytes, bytes]],
                         end_stream: bool) -> None:
        """A new stream opened with ``headers`` (``end_stream``: the client sends nothing more)."""

    def data_received(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        """Payload for an open stream; ``end_stream`` marks the client's half-close (data may be empty)."""

    def stream_reset(self, stream_id: int) -> None:
        """The stream ended abnormally (client reset, connection lost): release its state."""


class _Stream:
    __slots__ = ("pending", "remote_closed", "send_window", "trailers", "unacked")

    def __init__(self, send_window: int) -> None:
        self.send_window = send_window
        self.pending: deque[bytes | memoryview] = deque()
        self.trailers: bytes | None = None
        self.unacked = 0
        self.remote_closed = False


class _ConnectionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class H2Connection(asyncio.Protocol):
    """One client connection. ``on_close`` is called once when the transport closes."""

    def __init__(self, app: StreamApp, on_close: Callable[[H2Connection], None] | None = None) -> None:
        self.app = app
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.decoder = Decoder()
        self.last_stream = 0
        self.draining = False
        self._buf = bytearray()
        self._preface = False
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._peer_window = 65535
        self._peer_frame = 16384
        self._send_window = 65535
        self._unacked = 0
        self._block: tuple[int, int, bytearray] | None = None  # stream id, flags, header block so far

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        settings = struct.pack(">HLHLHL", 0x4, STREAM_WINDOW, 0x5, MAX_FRAME_IN, 0x2, 0)
        self._emit(_frame(_SETTINGS, 0, 0, settings))
        self._emit(_frame(_WINDOW, 0, 0, struct.pack(">L", CONNECTION_WINDOW - 65535)))

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        try:
            if not self._preface:
                if len(buf) < len(PREFACE):
                    return
                if buf[:len(PREFACE)] != PREFACE:
                    raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 client preface")
                del buf[:len(PREFACE)]
                self._preface = True
            self._frames(buf)
        except _ConnectionError as exc:
            log.warning("HTTP/2 connection error: %s", exc)
            self._fail(exc.code)

    def connection_lost(self, exc: Exception | None) -> None:
        streams, self.streams = self.streams, {}
        for stream_id in streams:
            self.app.stream_reset(stream_id)
        self.transport = None
        if self.on_close is not None:
            self.on_close(self)

    # -- what the application sends -----------------------------------------------------------------------------

    def send_headers(self, stream_id: int, block: bytes) -> None:
        """Response headers (not the end of the stream)."""
        if stream_id in self.streams:
            self._emit(_frame(_HEADERS, _END_HEADERS, stream_id, block))

    def send_data(self, stream_id: int, data: bytes) -> None:
        """Queue ``data`` and send as much as the flow-control windows allow."""
        stream = self.streams.get(stream_id)
        if stream is not None and data:
            stream.pending.append(data)
            self._drain(stream_id, stream)

    def finish(self, stream_id: int, trailers: bytes) -> None:
        """End the stream with a trailers block, after its queued data. If the client had not finished sending,
        the stream is then reset with NO_ERROR so that it stops (RFC 9113 §8.1)."""
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.trailers = trailers
            self._drain(stream_id, stream)

    def goaway(self) -> None:
        """Refuse new streams from now on; open ones run to their end."""
        if not self.draining and self.transport is not None:
            self.draining = True
            self._emit(_frame(_GOAWAY, 0, 0, struct.pack(">LL", self.last_stream, ErrorCode.NO_ERROR)))

    def close(self) -> None:
        """Close the transport now (open streams are reset)."""
        if self.transport is not None:
            self._flush()
            self.transport.close()

    # -- frames in ----------------------------------------------------------------------------------------------

    def _frames(self, buf: bytearray) -> None:
        pos, size = 0, len(buf)
        while size - pos >= 9:
            hi, lo, kind, flags, stream_id = _HEAD.unpack_from(buf, pos)
            length = hi << 16 | lo
            if length > MAX_FRAME_IN:
                raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, f"frame of {length} bytes")
            if size - pos - 9 < length:
                break
            payload = bytes(buf[pos + 9:pos + 9 + length])
            pos += 9 + length
            self._frame(kind, flags, stream_id & _MAX_WINDOW, payload)
            if self.transport is None:
                break
        del buf[:pos]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is not None and kind != _CONTINUATION:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "header block interrupted")
        if kind == _DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == _HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == _CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind == _WINDOW:
            self._on_window(stream_id, payload)
        elif kind == _SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == _PING:
            if len(payload) != 8 or stream_id:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "bad PING")
            if not flags & _ACK:
                self._emit(_frame(_PING, _ACK, 0, payload))
        elif kind == _RST:
            if self.streams.pop(stream_id, None) is not None:
                self.app.stream_reset(stream_id)
        elif kind == _GOAWAY:
            self.draining = True
        elif kind == _PUSH:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # PRIORITY and unknown frame types are ignored, as the RFC requires.

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id or stream_id > self.last_stream:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "DATA on an idle stream")
        self._unacked += len(payload)
        if self._unacked >= CONNECTION_WINDOW // 2:
            self._emit(_frame(_WINDOW, 0, 0, struct.pack(">L", self._unacked)))
            self._unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream EPP already finished: the client's late data is dropped
        data = _unpad(flags, payload)
        end = bool(flags & _END_STREAM)
        if end:
            stream.remote_closed = True
        else:
            stream.unacked += len(payload)
            if stream.unacked >= STREAM_WINDOW // 2:
                self._emit(_frame(_WINDOW, 0, stream_id, struct.pack(">L", stream.unacked)))
                stream.unacked = 0
        self.app.data_received(stream_id, data, end)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        fragment = _unpad(flags, payload)
        if flags & _PRIORITY_FLAG:
            fragment = fragment[5:]
        if flags & _END_HEADERS:
            self._headers_done(stream_id, flags, fragment)
        else:
            self._block = (stream_id, flags, bytearray(fragment))

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is None or self._block[0] != stream_id:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "unexpected CONTINUATION")
        block = self._block[2]
        block += payload
        if len(block) > self.decoder.max_list_size:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "header block too large")
        if flags & _END_HEADERS:
            start_flags = self._block[1]
            self._block = None
            self._headers_done(stream_id, start_flags, bytes(block))

    def _headers_done(self, stream_id: int, flags: int, block: bytes) -> None:
        try:
            headers = self.decoder.decode(block)
        except HpackError as exc:
            raise _ConnectionError(ErrorCode.COMPRESSION_ERROR, str(exc)) from None
        end = bool(flags & _END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client: only their end-of-stream matters
            if not end:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "second HEADERS without END_STREAM")
            stream.remote_closed = True
            self.app.data_received(stream_id, b"", True)
            return
        if not stream_id & 1:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"HEADERS opening even stream {stream_id}")
        if stream_id <= self.last_stream:
            return  # trailers for a stream EPP already finished (decoded above to keep the HPACK state)
        self.last_stream = stream_id
        if self.draining:
            self._emit(_frame(_RST, 0, stream_id, struct.pack(">L", ErrorCode.REFUSED_STREAM)))
            return
        stream = self.streams[stream_id] = _Stream(self._peer_window)
        stream.remote_closed = end
        self.app.headers_received(self, stream_id, headers, end)

    def _on_window(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        increment = int.from_bytes(payload, "big") & _MAX_WINDOW
        if not stream_id:
            self._send_window += increment
            if self._send_window > _MAX_WINDOW:
                raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "connection window overflow")
            for sid, open_stream in list(self.streams.items()):
                self._drain(sid, open_stream)
            return
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.send_window += increment
            self._drain(stream_id, stream)

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id or len(payload) % 6:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "bad SETTINGS")
        if flags & _ACK:
            return
        for key, value in struct.iter_unpack(">HL", payload):
            if key == 0x4:
                if value > _MAX_WINDOW:
                    raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "initial window too large")
                delta, self._peer_window = value - self._peer_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == 0x5:
                if not 16384 <= value <= 16777215:
                    raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "bad max frame size")
                self._peer_frame = value
        self._emit(_frame(_SETTINGS, _ACK, 0, b""))
        for sid, stream in list(self.streams.items()):
            self._drain(sid, stream)

    # -- frames out ---------------------------------------------------------------------------------------------

    def _drain(self, stream_id: int, stream: _Stream) -> None:
        pending = stream.pending
        while pending:
            room = min(stream.send_window, self._send_window, self._peer_frame)
            if room <= 0:
                return
            chunk = pending[0]
            if len(chunk) > room:  # memoryview: an 8 MB body leaves in frames without copying the rest each time
                view = chunk if isinstance(chunk, memoryview) else memoryview(chunk)
                pending[0] = view[room:]
                chunk = view[:room]
            else:
                pending.popleft()
            stream.send_window -= len(chunk)
            self._send_window -= len(chunk)
            self._emit(_frame(_DATA, 0, stream_id, chunk))
        if stream.trailers is not None:
            self._emit(_frame(_HEADERS, _END_HEADERS | _END_STREAM, stream_id, stream.trailers))
            if not stream.remote_closed:
                self._emit(_frame(_RST, 0, stream_id, struct.pack(">L", ErrorCode.NO_ERROR)))
            del self.streams[stream_id]

    def _emit(self, frame: bytes) -> None:
        """Queue a frame; everything queued during one event-loop iteration, on every stream of the connection,
        leaves in one write at the start of the next (each loopback send costs as much as a request's routing)."""
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None:
            out, self._out = self._out, []
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _fail(self, code: int) -> None:
        if self.transport is not None:
            self._emit(_frame(_GOAWAY, 0, 0, struct.pack(">LL", self.last_stream, code)))
            self._flush()
            self.transport.close()
            self.transport = None
            streams, self.streams = self.streams, {}
            for stream_id in streams:
                self.app.stream_reset(stream_id)


def _frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview) -> bytes:
    n = len(payload)
    return _HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def _unpad(flags: int, payload: bytes) -> bytes:
    if not flags & _PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "bad padding")
    return payload[1:len(payload) - payload[0]]
