"""One HTTP/2 server connection's state and everything it does but read frames: the base of
:class:`~epp.extproc.h2.connection.H2Connection`.

:class:`H2Session` holds the connection's streams, windows and counters, and does what the application asks
(:meth:`~H2Session.send_headers`, :meth:`~H2Session.send_data`, :meth:`~H2Session.finish`, :meth:`~H2Session.consume`,
:meth:`~H2Session.expect`, :meth:`~H2Session.goaway`, :meth:`~H2Session.close`). Frames out are flow-controlled
(DATA waits for send windows), queued and written once per event-loop iteration, bounded by the outbound flood
limits, and held while the transport has paused writing. It ends streams (a stream error resets one) and the
connection: GOAWAY with an error code, the preface and write timeouts, and a graceful close after
:attr:`~epp.extproc.h2.limits.H2Limits.idle_timeout` without streams. ``stream_reset`` is told of every stream that
ends abnormally. It never raises a protocol error into the application's calls.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from collections.abc import Callable
from typing import cast

from epp.extproc.h2.flow import H2Stream, ReceiveWindows
from epp.extproc.h2.frames import (
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    PING,
    RST_STREAM,
    SETTINGS,
    U32,
    WINDOW_UPDATE,
    ErrorCode,
    frame,
)
from epp.extproc.h2.limits import H2Limits

__all__ = ["H2Session", "IDLE_PING", "RESET_BY_US", "RESET_BY_PEER", "ENDED"]

log = logging.getLogger("epp.extproc.h2")

IDLE_PING = b"epp-idle"
"""The payload of the PING an idle close waits for: its acknowledgement means the peer saw the first GOAWAY."""
# How a closed stream ended, which decides what a late frame on it means (RFC 9113 §5.1 "closed").
RESET_BY_US, RESET_BY_PEER, ENDED = range(3)


class H2Session(asyncio.Protocol):
    """A connection's state and its output; :class:`~epp.extproc.h2.connection.H2Connection` reads its frames."""

    def __init__(self, stream_reset: Callable[[int], None], limits: H2Limits) -> None:
        self._stream_reset = stream_reset
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, H2Stream] = {}
        self.last_stream = 0
        self.draining = False
        self._out: list[bytes] = []
        self._max_out = limits.max_outbound_frames
        self._out_control = 0
        self._flush_scheduled = False
        self._paused = False
        self._peer_window = DEFAULT_WINDOW
        self._peer_frame = 16384
        self._send_window = DEFAULT_WINDOW
        self.windows = ReceiveWindows(limits, self.streams, self._emit)
        self._closed: dict[int, int] = {}  # recently closed stream id -> how it ended
        self._closed_order: deque[int] = deque()
        self._closed_floor = 0  # closed ids at or below this were forgotten
        self._answered = 0
        self._ended = 0  # streams opened and closed since
        self._data_out = 0
        self._idle_since = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._timer: asyncio.TimerHandle | None = None  # preface, idle-close or abort-after-close deadline
        self._stall: asyncio.TimerHandle | None = None  # writing paused since
        self._closing = False  # an idle close is under way

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport (uvloop's are no subclasses)
        self._loop = loop = asyncio.get_running_loop()
        limits = self.limits
        settings = struct.pack(">HLHLHLHLHL", 0x2, 0, 0x3, limits.max_concurrent_streams,
                               0x4, limits.initial_stream_window, 0x5, limits.max_frame_size,
                               0x6, limits.max_header_list_size)
        self._emit(frame(SETTINGS, 0, 0, settings))
        if limits.initial_connection_window > DEFAULT_WINDOW:
            self._emit(frame(WINDOW_UPDATE, 0, 0, U32.pack(limits.initial_connection_window - DEFAULT_WINDOW)))
        self._timer = loop.call_later(limits.preface_timeout, self._preface_expired)

    def pause_writing(self) -> None:
        """The transport's buffer is full: stop reading until the peer reads (frames already read are still
        processed; what they produce waits here, bounded by the outbound frame limits)."""
        self._paused = True
        if self.transport is not None:
            self.transport.pause_reading()
            if self._stall is None:
                self._stall = self._loop.call_later(self.limits.write_timeout, self._write_stalled)

    def resume_writing(self) -> None:
        self._paused = False
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if self.transport is None:
            return
        self.transport.resume_reading()
        self._flush()
        for sid, stream in list(self.streams.items()):
            if stream.pending or stream.trailers is not None:
                self._drain(sid, stream)

    # -- what the application does ------------------------------------------------------------------------------

    def send_headers(self, stream_id: int, block: bytes) -> None:
        """Response headers (not the end of the stream)."""
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.answered = True
            self._answered += 1
            self._emit(frame(HEADERS, END_HEADERS, stream_id, block))

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

    def consume(self, stream_id: int, size: int) -> None:
        """The application is done with ``size`` bytes of the stream's data: the peer may send as many again."""
        self.windows.consume(stream_id, size)

    def expect(self, stream_id: int, size: int) -> None:
        """The application needs ``size`` bytes of the stream at once (a message larger than the stream window);
        0 withdraws it (:meth:`ReceiveWindows.expect`)."""
        self.windows.expect(stream_id, size)

    def goaway(self) -> None:
        """Refuse new streams from now on; open ones run to their end."""
        if not self.draining and self.transport is not None:
            self.draining = True
            self._emit(frame(GOAWAY, 0, 0, struct.pack(">LL", self.last_stream, ErrorCode.NO_ERROR)))

    def close(self) -> None:
        """Close the transport now (open streams are reset)."""
        if self.transport is not None:
            self._flush()
            self._close_transport()

    # -- frames out ---------------------------------------------------------------------------------------------

    def _drain(self, stream_id: int, stream: H2Stream) -> None:
        pending = stream.pending
        while pending:
            room = min(stream.send_window, self._send_window, self._peer_frame)
            if room <= 0 or self._paused:
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
            self._data_out += 1
            self._emit(frame(DATA, 0, stream_id, chunk))
        if stream.trailers is not None:
            if not stream.answered:
                self._answered += 1
            self._emit(frame(HEADERS, END_HEADERS | END_STREAM, stream_id, stream.trailers))
            if stream.remote_closed:
                self._remove(stream_id, ENDED)
            else:
                self._emit_control(frame(RST_STREAM, 0, stream_id, U32.pack(ErrorCode.NO_ERROR)))
                self._remove(stream_id, RESET_BY_US)

    def _stream_error(self, stream_id: int, code: int, message: str) -> None:
        log.info("HTTP/2 stream %d error: %s", stream_id, message)
        self._emit_control(frame(RST_STREAM, 0, stream_id, U32.pack(code)))
        if stream_id in self.streams:
            self._remove(stream_id, RESET_BY_US)
            self._stream_reset(stream_id)
        else:
            self._remember(stream_id, RESET_BY_US)

    def _remove(self, stream_id: int, how: int) -> None:
        stream = self.streams.pop(stream_id)
        self._ended += 1
        self._remember(stream_id, how)
        self.windows.closed(stream)
        if not self.streams:
            self._became_idle()

    def _remember(self, stream_id: int, how: int) -> None:
        closed, order = self._closed, self._closed_order
        closed[stream_id] = how
        order.append(stream_id)
        if len(order) > self.limits.max_concurrent_streams:
            old = order.popleft()
            closed.pop(old, None)
            if old > self._closed_floor:
                self._closed_floor = old

    def _emit_control(self, data: bytes) -> None:
        """A frame the peer provokes (acknowledgement, RST_STREAM): Envoy's max_outbound_control_frames."""
        self._out_control += 1
        if self._out_control > self.limits.max_outbound_control_frames:
            return self._flood("control frames queued faster than the peer reads them")
        self._emit(data)

    def _emit(self, data: bytes) -> None:
        """Queue a frame; everything queued during one event-loop iteration, on every stream of the connection,
        leaves in one write at the start of the next (each loopback send costs as much as a request's routing)."""
        if self.transport is None:
            return
        out = self._out
        out.append(data)
        if len(out) > self._max_out:
            return self._flood("frames queued faster than the peer reads them")
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._paused or self.transport is None:
            return
        if self._out:
            out, self._out = self._out, []
            self._out_control = 0
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    # -- connection end -----------------------------------------------------------------------------------------

    def _flood(self, what: str) -> None:
        """Never raises: it may run inside the application's calls, which must not see protocol errors."""
        log.warning("HTTP/2 flood: %s; closing the connection", what)
        self._fail(ErrorCode.ENHANCE_YOUR_CALM)

    def _fail(self, code: int) -> None:
        if self.transport is None:
            return
        if not self._paused:
            self._out.append(frame(GOAWAY, 0, 0, struct.pack(">LL", self.last_stream, code)))
            self._flush()
        self._close_transport()
        self.transport = None
        streams = list(self.streams)  # emptied in place: the receive windows share the dict
        self.streams.clear()
        for stream_id in streams:
            self._stream_reset(stream_id)

    def _close_transport(self) -> None:
        """Close after the queued output; a peer that does not read it within the write timeout is cut off."""
        transport = self.transport
        if transport is None:
            return
        if self._paused:
            transport.abort()
            return
        transport.close()
        self._set_timer(self.limits.write_timeout, transport.abort)

    def _preface_expired(self) -> None:
        log.info("HTTP/2 client sent no preface within %.1f s; closing", self.limits.preface_timeout)
        self._timer = None
        self._fail(ErrorCode.PROTOCOL_ERROR)

    def _write_stalled(self) -> None:
        log.warning("HTTP/2 peer read nothing for %.1f s; aborting the connection", self.limits.write_timeout)
        self._stall = None
        if self.transport is not None:
            self.transport.abort()

    def _became_idle(self) -> None:
        if self.draining or self._closing:
            if self.draining and not self.streams and self.transport is not None:
                self.close()
            return
        timeout = self.limits.idle_timeout
        if not timeout:
            return
        self._idle_since = self._loop.time()
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_at(self._idle_since + timeout, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        if self.transport is None or self.streams or not self._idle_since:
            return
        due = self._idle_since + self.limits.idle_timeout
        if self._loop.time() < due:
            self._idle_timer = self._loop.call_at(due, self._idle_check)
            return
        # Graceful (RFC 9113 §6.8): announce with the largest stream id so that a stream the peer opens meanwhile
        # is still served, then after a PING round trip name the real last stream and close.
        self._closing = True
        self._emit(frame(GOAWAY, 0, 0, struct.pack(">LL", MAX_WINDOW, ErrorCode.NO_ERROR)))
        self._emit(frame(PING, 0, 0, IDLE_PING))
        self._set_timer(self.limits.write_timeout, self._final_goaway)

    def _final_goaway(self) -> None:
        self._cancel_timer()
        if self.transport is None or self.draining:
            return
        self.goaway()
        if not self.streams:
            self.close()

    def _set_timer(self, delay: float, callback: Callable[[], object]) -> None:
        self._cancel_timer()
        self._timer = self._loop.call_later(delay, callback)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
