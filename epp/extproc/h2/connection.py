"""A small HTTP/2 server connection (RFC 9113) for EPP's gRPC front, hardened against hostile peers.

:class:`H2Connection` is the :class:`asyncio.Protocol`: it reads the client's frames and hands each stream's headers
and data to a :class:`StreamApp`; what it does besides (sending, flow control, closing) is its base's,
:class:`~epp.extproc.h2.session.H2Session`. Every frame is checked as RFC 9113 requires (§4-§8; request headers by
:mod:`~epp.extproc.h2.messages`): a stream error resets one stream (the application sees
:meth:`StreamApp.stream_reset`), a connection error ends the connection with GOAWAY, and a flood (empty frames,
CONTINUATION, PRIORITY, WINDOW_UPDATE, refused streams beyond :class:`~epp.extproc.h2.limits.H2Limits`) with
ENHANCE_YOUR_CALM, as does a peer resetting most of its streams before they are answered (Rapid Reset).
Hand-written rather than built on the ``h2`` package for its CPU cost (docs/benchmarks.md);
``tests/extproc/test_h2_conformance.py`` holds it to RFC 9113.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Protocol

from epp.extproc.h2.flow import H2Stream
from epp.extproc.h2.frames import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEAD,
    HEADERS,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    U32,
    WINDOW_UPDATE,
    ErrorCode,
    H2ConnectionError,
    H2StreamError,
    frame,
    unpad,
)
from epp.extproc.h2.hpack import Decoder, HeaderListTooLarge, HpackError
from epp.extproc.h2.limits import H2Limits
from epp.extproc.h2.messages import check_request
from epp.extproc.h2.session import IDLE_PING, RESET_BY_PEER, RESET_BY_US, H2Session

__all__ = ["ErrorCode", "H2Connection", "H2Limits", "StreamApp"]

log = logging.getLogger("epp.extproc.h2")


class StreamApp(Protocol):
    """What runs on top of the connection: one call per stream."""

    def headers_received(self, conn: H2Connection, stream_id: int, headers: list[tuple[bytes, bytes]],
                         end_stream: bool) -> None:
        """A new stream opened with ``headers`` (``end_stream``: the client sends nothing more)."""

    def data_received(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        """Payload for an open stream; ``end_stream`` marks the client's half-close (data may be empty). The
        bytes count against the stream's window until :meth:`H2Connection.consume` reports them consumed."""

    def stream_reset(self, stream_id: int) -> None:
        """The stream ended abnormally (client reset, stream error, connection lost): release its state."""


class H2Connection(H2Session):
    """One client connection. ``on_close`` is called once when the transport closes."""

    def __init__(self, app: StreamApp, on_close: Callable[[H2Connection], None] | None = None,
                 limits: H2Limits | None = None) -> None:
        limits = limits or H2Limits()
        super().__init__(app.stream_reset, limits)
        self.app = app
        self.on_close = on_close
        self.decoder = Decoder(max_list_size=limits.max_header_list_size)
        self._buf = bytearray()
        self._preface = False
        self._settled = False  # the client's first SETTINGS arrived
        self._block: tuple[int, int, bytearray] | None = None  # stream id, flags, header block so far
        self._block_frames = 0
        self._refused = 0
        self._empty = 0
        self._priority_in = 0
        self._window_in = 0
        self._premature = 0  # streams the peer reset young and unanswered

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        try:
            if not self._preface:
                if buf[:len(PREFACE)] != PREFACE[:len(buf)]:
                    raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 client preface")
                if len(buf) < len(PREFACE):
                    return
                del buf[:len(PREFACE)]
                self._preface = True
            self._frames(buf)
        except H2ConnectionError as exc:
            log.warning("HTTP/2 connection error: %s", exc)
            self._fail(exc.code)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        for handle in (self._idle_timer, self._stall):
            if handle is not None:
                handle.cancel()
        streams = list(self.streams)  # emptied in place: the receive windows share the dict
        self.streams.clear()
        for stream_id in streams:
            self.app.stream_reset(stream_id)
        self.transport = None
        if self.on_close is not None:
            self.on_close(self)

    # -- frames in ----------------------------------------------------------------------------------------------

    def _frames(self, buf: bytearray) -> None:
        pos, size, limit = 0, len(buf), self.limits.max_frame_size
        try:
            while size - pos >= 9:
                hi, lo, kind, flags, stream_id = HEAD.unpack_from(buf, pos)
                length = hi << 16 | lo
                if length > limit:
                    raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, f"frame of {length} bytes")
                if size - pos - 9 < length:
                    break
                payload = bytes(buf[pos + 9:pos + 9 + length])
                pos += 9 + length
                try:
                    self._frame(kind, flags, stream_id & MAX_WINDOW, payload)
                except H2StreamError as exc:
                    self._stream_error(exc.stream_id, exc.code, str(exc))
                if self.transport is None:
                    break
        finally:
            del buf[:pos]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if not self._settled:
            if kind != SETTINGS or flags & ACK:
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "the preface must be followed by SETTINGS")
            self._settled = True
            self._cancel_timer()
            self._became_idle()
        if self._block is not None and kind != CONTINUATION:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "header block interrupted")
        if kind == DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._on_window(stream_id, payload)
        elif kind == SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == PING:
            self._on_ping(flags, stream_id, payload)
        elif kind == RST_STREAM:
            self._on_rst(stream_id, payload)
        elif kind == PRIORITY:
            self._on_priority(stream_id, payload)
        elif kind == GOAWAY:
            self._on_goaway(stream_id, payload)
        elif kind == PUSH_PROMISE:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # Unknown frame types are ignored, as the RFC requires (§4.1, §5.5).

    def _count_empty(self, length: int, flags: int) -> None:
        """Envoy's max_consecutive_inbound_frames_with_empty_payload: such frames have no legitimate use."""
        if length or flags & END_STREAM:
            self._empty = 0
            return
        self._empty += 1
        if self._empty > self.limits.max_consecutive_inbound_frames_with_empty_payload:
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "too many empty frames")

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        length = len(payload)
        if self._empty or not length:
            self._count_empty(length, flags)
        windows = self.windows
        if length > windows.credit:
            raise H2ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        windows.credit -= length  # counted even on a closed stream (§6.9)
        stream = self.streams.get(stream_id)
        if (stream is None or flags & PADDED or stream.remote_closed or length > stream.recv_credit
                or stream.content_left >= 0):
            return self._on_data_checked(flags, stream_id, payload, stream)
        stream.recv_credit -= length  # the common case, in short
        stream.buffered += length
        windows.buffered += length
        end = flags & END_STREAM
        if end:
            stream.remote_closed = True
        self.app.data_received(stream_id, payload, bool(end))

    def _on_data_checked(self, flags: int, stream_id: int, payload: bytes, stream: H2Stream | None) -> None:
        if not stream_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        length = len(payload)
        if stream is None:
            self._late_frame(stream_id, "DATA")
            if self.windows.credit < self.windows.low:
                self.windows.credit_connection()
            return
        data = unpad(flags, payload)
        if stream.remote_closed:
            raise H2StreamError(stream_id, ErrorCode.STREAM_CLOSED, "DATA after END_STREAM")
        if length > stream.recv_credit:
            raise H2StreamError(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the stream window")
        stream.recv_credit -= length
        n = len(data)
        stream.buffered += n
        self.windows.buffered += n
        end = bool(flags & END_STREAM)
        if stream.content_left >= 0:
            stream.content_left -= n
            if stream.content_left < 0 or end and stream.content_left:
                raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "DATA does not match content-length")
        if n != length:  # padding is consumed at once
            stream.buffered += length - n
            self.windows.buffered += length - n
            self.consume(stream_id, length - n)
        if end:
            stream.remote_closed = True
        self.app.data_received(stream_id, data, end)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        if self._empty or not payload:
            self._count_empty(len(payload), flags)
        fragment = unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(fragment) < 5:
                raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            depends_on = U32.unpack_from(fragment)[0] & MAX_WINDOW
            fragment = fragment[5:]
            if depends_on == stream_id:
                flags |= 0x100  # remembered: a stream error once the block is decoded (HPACK state must advance)
        if len(fragment) > self.limits.max_header_list_size:
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            self._headers_done(stream_id, flags, fragment)
        else:
            self._block = (stream_id, flags, bytearray(fragment))
            self._block_frames = 0

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is None or self._block[0] != stream_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "unexpected CONTINUATION")
        self._count_empty(len(payload), 0)
        self._block_frames += 1
        if self._block_frames > self.limits.max_continuation_frames:
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        block = self._block[2]
        block += payload
        if len(block) > self.limits.max_header_list_size:
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            start_flags = self._block[1]
            self._block = None
            self._headers_done(stream_id, start_flags, bytes(block))

    def _headers_done(self, stream_id: int, flags: int, block: bytes) -> None:
        try:
            headers = self.decoder.decode(block)
        except HeaderListTooLarge as exc:
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, str(exc)) from None
        except HpackError as exc:
            raise H2ConnectionError(ErrorCode.COMPRESSION_ERROR, str(exc)) from None
        end = bool(flags & END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:
            return self._trailers(stream_id, stream, headers, end)
        if stream_id <= self.last_stream:
            return self._late_frame(stream_id, "HEADERS")
        if not stream_id & 1:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"HEADERS opening even stream {stream_id}")
        self.last_stream = stream_id
        if flags & 0x100:
            raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "stream depends on itself")
        if self.draining:
            return self._refuse(stream_id, counted=False)
        if len(self.streams) >= self.limits.max_concurrent_streams:
            return self._refuse(stream_id, counted=True)
        try:
            content_length = check_request(headers)
        except ValueError as exc:
            raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, str(exc)) from None
        if end and content_length > 0:
            raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "content-length on a request without DATA")
        self._open(stream_id, headers, end, content_length)

    def _open(self, stream_id: int, headers: list[tuple[bytes, bytes]], end: bool, content_length: int) -> None:
        window = self.limits.initial_stream_window
        stream = self.streams[stream_id] = H2Stream(self._peer_window, window)
        self.windows.opened(stream)
        stream.remote_closed = end
        stream.content_left = content_length
        stream.opened = self._loop.time()
        if self._idle_since:
            self._idle_since = 0.0
        self.app.headers_received(self, stream_id, headers, end)

    def _trailers(self, stream_id: int, stream: H2Stream, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        if stream.remote_closed:
            raise H2StreamError(stream_id, ErrorCode.STREAM_CLOSED, "HEADERS after END_STREAM")
        if not end:
            raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "second HEADERS without END_STREAM")
        if any(name[:1] == b":" for name, _ in headers):
            raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "pseudo-header in trailers")
        if stream.content_left > 0:
            raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "DATA does not match content-length")
        stream.remote_closed = True
        self.app.data_received(stream_id, b"", True)

    def _late_frame(self, stream_id: int, kind: str) -> None:
        """DATA or HEADERS on a stream that is not open: idle, or closed in one of three ways (§5.1)."""
        if stream_id > self.last_stream or not stream_id & 1:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"{kind} on idle stream {stream_id}")
        how = self._closed.get(stream_id)
        if how == RESET_BY_US or how is None and stream_id <= self._closed_floor:
            return  # in flight before our RST_STREAM arrived (or long forgotten): ignored, as §5.1 requires
        if how == RESET_BY_PEER:
            self._emit_control(frame(RST_STREAM, 0, stream_id, U32.pack(ErrorCode.STREAM_CLOSED)))
            return
        if how is None and kind == "HEADERS":
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"HEADERS reusing a lower stream id {stream_id}")
        raise H2ConnectionError(ErrorCode.STREAM_CLOSED, f"{kind} on closed stream {stream_id}")

    def _refuse(self, stream_id: int, counted: bool) -> None:
        if counted:
            self._refused += 1
            if self._refused > self.limits.max_concurrent_streams:
                raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "streams beyond the advertised limit")
        self._emit_control(frame(RST_STREAM, 0, stream_id, U32.pack(ErrorCode.REFUSED_STREAM)))
        self._remember(stream_id, RESET_BY_US)

    def _on_window(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE of a wrong length")
        self._window_in += 1
        limits = self.limits
        if self._window_in > 5 + 2 * (self._answered + limits.max_inbound_window_update_frames_per_data_frame_sent
                                      * self._data_out):
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "WINDOW_UPDATE flood")
        increment = U32.unpack(payload)[0] & MAX_WINDOW
        if not stream_id:
            if not increment:
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise H2ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "connection window overflow")
            for sid, open_stream in list(self.streams.items()):
                if open_stream.pending or open_stream.trailers is not None:
                    self._drain(sid, open_stream)
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream or not stream_id & 1:
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return  # a stream that just closed: the peer had not seen it yet
        if not increment:
            raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            raise H2StreamError(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "stream window overflow")
        self._drain(stream_id, stream)

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS of a wrong length")
        for key, value in struct.iter_unpack(">HL", payload):
            if key == 0x4:
                if value > MAX_WINDOW:
                    raise H2ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "initial window too large")
                delta, self._peer_window = value - self._peer_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise H2ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "stream window overflow")
            elif key == 0x5:
                if not 16384 <= value <= 16777215:
                    raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "bad max frame size")
                self._peer_frame = value
            elif key in (0x2, 0x8) and value > 1:
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"SETTINGS {key} must be 0 or 1")
        self._emit_control(frame(SETTINGS, ACK, 0, b""))
        for sid, stream in list(self.streams.items()):
            self._drain(sid, stream)

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "PING of a wrong length")
        if not flags & ACK:
            self._emit_control(frame(PING, ACK, 0, payload))
        elif payload == IDLE_PING and self._closing:
            self._final_goaway()

    def _on_rst(self, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of a wrong length")
        if stream_id > self.last_stream or not stream_id & 1:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._remove(stream_id, RESET_BY_PEER)
            self.app.stream_reset(stream_id)
            young = self._loop.time() - stream.opened < self.limits.premature_reset_min_stream_lifetime
            if young and not stream.answered:
                self._reset_prematurely()

    def _reset_prematurely(self) -> None:
        """Envoy's premature-reset check on unanswered streams (``H2Limits.premature_reset_min_stream_lifetime``),
        made as each such reset arrives rather than at every close: a normal close can only lower the share."""
        self._premature += 1
        ended = self._ended
        if ended >= self.limits.premature_reset_total_stream_count and 2 * self._premature > ended:
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, f"{self._premature} of {ended} streams reset "
                                    "before they were answered")

    def _on_priority(self, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
        self._priority_in += 1
        if self._priority_in > self.limits.max_inbound_priority_frames_per_stream * (1 + self._answered):
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "PRIORITY flood")
        idle = stream_id > self.last_stream or not stream_id & 1  # PRIORITY may name an idle stream, but RST_STREAM may not (§5.1)
        if len(payload) != 5:
            if idle:
                raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "PRIORITY of a wrong length")
            raise H2StreamError(stream_id, ErrorCode.FRAME_SIZE_ERROR, "PRIORITY of a wrong length")
        if U32.unpack_from(payload)[0] & MAX_WINDOW == stream_id:
            if idle:
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "stream depends on itself")
            raise H2StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "stream depends on itself")

    def _on_goaway(self, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY too short")
        self.draining = True  # the client is leaving: no new streams; close once the open ones end
        if not self.streams:
            self.close()
