"""HTTP/2 flow control on the receiving side (RFC 9113 §5.2, §6.9): how much a peer may send, and when it may send
more.

:class:`H2Stream` is one open stream's state (its send window and queue, what its peer may still send).
:class:`ReceiveWindows` credits a connection's windows only as the application consumes what it was given
(:meth:`~ReceiveWindows.consume`), so a stream never holds more than its target (the stream window) unconsumed and
the connection never more than :attr:`~epp.extproc.h2.limits.H2Limits.connection_buffer`. A stream may reserve more
than its window for one large message (:meth:`~ReceiveWindows.expect`): granted whole while the budget allows (always
when no other stream holds one), else queued until earlier reservations are released. WINDOW_UPDATE frames go out
through the ``emit`` the connection gives.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from epp.extproc.h2.frames import U32, WINDOW_UPDATE, frame
from epp.extproc.h2.limits import H2Limits

__all__ = ["H2Stream", "ReceiveWindows"]


class H2Stream:
    """One open stream: its send side (window, queued data, trailers) and its receive side (credit, buffered
    bytes, target)."""

    __slots__ = ("answered", "buffered", "content_left", "opened", "pending", "recv_credit", "remote_closed",
                 "send_window", "target", "trailers")

    def __init__(self, send_window: int, recv_window: int) -> None:
        self.send_window = send_window
        self.pending: deque[bytes | memoryview] = deque()
        self.trailers: bytes | None = None
        self.remote_closed = False
        self.recv_credit = recv_window  # what the peer may still send on this stream
        self.buffered = 0  # delivered to the application, not yet consumed
        self.target = recv_window  # recv_credit + buffered is topped up to this; above the window for a reservation
        self.content_left = -1  # content-length still to come (-1: none announced)
        self.answered = False  # response headers sent (counts for the PRIORITY and WINDOW_UPDATE flood limits)
        self.opened = 0.0  # the event loop's time when the stream opened (for the premature-reset check)


class ReceiveWindows:
    """The receive windows of one connection and of its open streams (``streams``, shared with the connection)."""

    __slots__ = ("credit", "buffered", "targets", "low", "waiting", "reserved", "_budget", "_emit", "_floor",
                 "_limits", "_streams")

    def __init__(self, limits: H2Limits, streams: dict[int, H2Stream], emit: Callable[[bytes], None]) -> None:
        self._limits = limits
        self._streams = streams
        self._emit = emit
        self.credit = limits.initial_connection_window  # what the peer may still send on the connection
        self.buffered = 0  # delivered to the application, not yet consumed
        self.targets = 0  # sum of the open streams' receive targets
        self.low = limits.initial_connection_window >> 1  # connection credit below this is topped up
        self._budget, self._floor = limits.connection_buffer, limits.initial_connection_window
        self.waiting: deque[tuple[int, int]] = deque()  # (stream id, size) reservations waiting for budget
        self.reserved = 0  # streams holding a reservation above the stream window

    def opened(self, stream: H2Stream) -> None:
        """A stream opened (with its target at the stream window)."""
        self.targets += stream.target
        self._retarget()

    def closed(self, stream: H2Stream) -> None:
        """A stream closed (already out of ``streams``): its bytes and budget are released."""
        self.buffered -= stream.buffered
        self.targets -= stream.target
        if stream.target > self._limits.initial_stream_window:
            self.reserved -= 1
        self._retarget()
        if self.waiting:
            self._grant_waiting()
        if self.credit < self.low:
            self.credit_connection()

    def consume(self, stream_id: int, size: int) -> None:
        """The application is done with ``size`` bytes of the stream's data: the peer may send as many again."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # its bytes were released when it closed
        stream.buffered -= size
        self.buffered -= size
        if not stream.remote_closed and stream.recv_credit < stream.target >> 1:
            self._credit_stream(stream_id, stream)
        if self.credit < self.low:
            self.credit_connection()

    def expect(self, stream_id: int, size: int) -> None:
        """The application needs ``size`` bytes of the stream at once (a message larger than the stream window);
        0 withdraws it. Granted whole while the connection's budget allows (always when no other stream holds
        one), else when earlier reservations are released."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        window = self._limits.initial_stream_window
        if size <= window:
            self._unwait(stream_id)
            self._set_target(stream_id, stream, window)
            return
        if stream.target == size or any(sid == stream_id and want == size for sid, want in self.waiting):
            return
        self._unwait(stream_id)
        if self.reserved and self.targets - stream.target + size > self._limits.connection_buffer:
            self.waiting.append((stream_id, size))
            return
        self._set_target(stream_id, stream, size)

    def credit_connection(self) -> None:
        """Top the connection's credit up to its target, less what the application still holds."""
        deficit = self._connection_target() - self.credit - self.buffered
        if deficit > 0:
            self.credit += deficit
            self._emit(frame(WINDOW_UPDATE, 0, 0, U32.pack(deficit)))

    def _connection_target(self) -> int:
        limits = self._limits
        return min(limits.connection_buffer, max(limits.initial_connection_window, self.targets))

    def _retarget(self) -> None:
        targets = self.targets  # _connection_target() inlined: this runs as every stream opens and closes
        self.low = (self._budget if targets > self._budget else self._floor if targets < self._floor
                    else targets) >> 1

    def _credit_stream(self, stream_id: int, stream: H2Stream) -> None:
        deficit = stream.target - stream.recv_credit - stream.buffered
        if deficit > 0:
            stream.recv_credit += deficit
            self._emit(frame(WINDOW_UPDATE, 0, stream_id, U32.pack(deficit)))

    def _set_target(self, stream_id: int, stream: H2Stream, target: int) -> None:
        window = self._limits.initial_stream_window
        if stream.target == target:
            return
        self.reserved += (target > window) - (stream.target > window)
        self.targets += target - stream.target
        self._retarget()
        lower, stream.target = target < stream.target, target
        if lower:
            self._grant_waiting()  # budget freed: the next reservation in line
            return
        if not stream.remote_closed:
            self._credit_stream(stream_id, stream)
        self.credit_connection()

    def _unwait(self, stream_id: int) -> None:
        if self.waiting:
            self.waiting = deque(item for item in self.waiting if item[0] != stream_id)

    def _grant_waiting(self) -> None:
        budget = self._limits.connection_buffer
        while self.waiting:
            sid, size = self.waiting[0]
            stream = self._streams.get(sid)
            if stream is not None and self.reserved and self.targets - stream.target + size > budget:
                return
            self.waiting.popleft()
            if stream is not None:
                self._set_target(sid, stream, size)
