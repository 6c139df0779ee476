"""What one HTTP/2 connection lets a peer do: :class:`H2Limits`, every bound EPP's HTTP/2 server enforces.

Windows and buffers (how many unconsumed bytes a stream and the connection may hold), frame and header sizes,
concurrent streams, flood counters named and defaulted after Envoy's ``http2_protocol_options`` and its
premature-reset check (a violation ends the connection with GOAWAY ENHANCE_YOUR_CALM), and the preface, idle and
write timeouts. The values are checked when the limits are made (``ValueError``), so a connection never starts
with bounds it cannot keep.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.extproc.h2.frames import DEFAULT_WINDOW, MAX_WINDOW

__all__ = ["H2Limits"]


@dataclass(frozen=True, slots=True)
class H2Limits:
    """What one HTTP/2 connection lets a peer do. The flood limits carry Envoy's ``http2_protocol_options``
    names and defaults; a violation ends the connection with GOAWAY ENHANCE_YOUR_CALM."""

    initial_stream_window: int = 256 << 10
    """SETTINGS_INITIAL_WINDOW_SIZE: bytes a stream may have unconsumed (Envoy's recommended 256 KiB)."""
    initial_connection_window: int = 1 << 20
    """The connection window granted at once (Envoy's recommended 1 MiB); it grows with open streams' windows."""
    connection_buffer: int = 32 << 20
    """Ceiling of the connection window: unconsumed bytes of all streams together (one message may exceed it)."""
    max_frame_size: int = 1 << 20
    """SETTINGS_MAX_FRAME_SIZE: the largest frame accepted."""
    max_concurrent_streams: int = 1000
    """SETTINGS_MAX_CONCURRENT_STREAMS; more get REFUSED_STREAM, and as many refusals again end the connection.
    Not grpc's/nghttp2's 100: an ext_proc stream lasts its whole LLM request, so one Envoy connection carries
    hundreds; 1000 still bounds a connection's stream state to a few MB (Envoy opens another connection beyond)."""
    max_header_list_size: int = 16 << 10
    """SETTINGS_MAX_HEADER_LIST_SIZE, also the bound on an encoded header block (grpc's hard limit)."""
    max_continuation_frames: int = 8
    """CONTINUATION frames per header block (nghttp2's bound against CONTINUATION floods)."""
    max_outbound_frames: int = 10000
    """Frames queued and not yet written."""
    max_outbound_control_frames: int = 1000
    """PING/SETTINGS acknowledgements and RST_STREAM frames queued and not yet written."""
    max_consecutive_inbound_frames_with_empty_payload: int = 1
    """Consecutive DATA/HEADERS/CONTINUATION frames with no payload and no END_STREAM."""
    max_inbound_priority_frames_per_stream: int = 100
    """PRIORITY frames allowed: this times (1 + streams answered), over the connection's life."""
    max_inbound_window_update_frames_per_data_frame_sent: int = 10
    """WINDOW_UPDATE frames allowed: 5 + 2 * (streams answered + this * DATA frames sent)."""
    premature_reset_total_stream_count: int = 500
    """Streams a connection must have closed before the premature-reset check applies (Envoy's runtime key)."""
    premature_reset_min_stream_lifetime: float = 1.0
    """Seconds: a stream the peer resets younger than this, before EPP answered it, was reset prematurely. Once more
    than half of a connection's closed streams were, it ends with ENHANCE_YOUR_CALM (Rapid Reset, CVE-2023-44487:
    a reset stream frees its concurrency slot, so only this bounds the routings one connection makes EPP do). Envoy
    counts every early reset; EPP only unanswered ones, because Envoy resets each ext_proc stream about 1 ms after
    EPP's answer when the route's response mode is none. 0 disables the check."""
    preface_timeout: float = 10.0
    """Seconds from accept until the client preface and SETTINGS must have arrived."""
    idle_timeout: float = 300.0
    """Seconds without open streams before a graceful close (GOAWAY, PING round trip, final GOAWAY); 0: never.
    Shorter than Envoy's 1 h connection idle timeout, so EPP reclaims vanished peers; Envoy reconnects on demand."""
    write_timeout: float = 30.0
    """Seconds the peer may leave written data unread (writing paused, or a close flushing) before an abort."""

    def __post_init__(self) -> None:
        if not DEFAULT_WINDOW <= self.initial_connection_window <= self.connection_buffer <= MAX_WINDOW:
            raise ValueError("need 65535 <= initial_connection_window <= connection_buffer <= 2**31-1")
        if not 1 <= self.initial_stream_window <= MAX_WINDOW:
            raise ValueError("initial_stream_window must be in [1, 2**31-1]")
        if not 16384 <= self.max_frame_size <= 16777215:
            raise ValueError("max_frame_size must be in [16384, 16777215]")
        if min(self.max_concurrent_streams, self.max_header_list_size, self.max_outbound_frames,
               self.max_outbound_control_frames, self.max_inbound_priority_frames_per_stream,
               self.max_inbound_window_update_frames_per_data_frame_sent,
               self.premature_reset_total_stream_count) < 1:
            raise ValueError("stream, header, frame and flood limits must be positive")
        if min(self.max_continuation_frames, self.max_consecutive_inbound_frames_with_empty_payload) < 0:
            raise ValueError("max_continuation_frames and the empty-frame limit cannot be negative")
        if min(self.preface_timeout, self.write_timeout) <= 0 or min(self.idle_timeout,
                                                                      self.premature_reset_min_stream_lifetime) < 0:
            raise ValueError("timeouts must be positive (idle_timeout and the premature-reset lifetime: 0 disables)")
