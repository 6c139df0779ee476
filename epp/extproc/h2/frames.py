"""HTTP/2 framing (RFC 9113 §4, §6): frame types, flags, error codes, and the two errors a peer's frames can cause.

Pure definitions: :func:`frame` builds one frame, :func:`unpad` strips a padded frame's padding. A malformed frame
raises :class:`H2ConnectionError` (the connection ends with GOAWAY and its code) or :class:`H2StreamError` (one
stream is reset), as RFC 9113 §5.4 sorts them; the connection decides which applies, these only carry the code.
"""

from __future__ import annotations

import struct

__all__ = ["ErrorCode", "H2ConnectionError", "H2StreamError", "frame", "unpad", "PREFACE", "HEAD", "U32",
           "DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING", "GOAWAY",
           "WINDOW_UPDATE", "CONTINUATION", "END_STREAM", "ACK", "END_HEADERS", "PADDED", "PRIORITY_FLAG",
           "MAX_WINDOW", "DEFAULT_WINDOW"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""The client connection preface (§3.4)."""
HEAD = struct.Struct(">BHBBL")
"""A frame header: length (24 bits, as a byte and a short), type, flags, stream id (with the reserved bit)."""
U32 = struct.Struct(">L")
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
MAX_WINDOW = (1 << 31) - 1
"""The largest flow-control window, and the mask of a stream id."""
DEFAULT_WINDOW = 65535
"""The initial window of a connection and of a stream until SETTINGS say otherwise."""


class ErrorCode:
    """HTTP/2 error codes (RFC 9113 §7)."""

    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    STREAM_CLOSED = 5
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    CANCEL = 8
    COMPRESSION_ERROR = 9
    ENHANCE_YOUR_CALM = 11


class H2ConnectionError(Exception):
    """A connection error: the connection ends with GOAWAY ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class H2StreamError(Exception):
    """A stream error: stream ``stream_id`` is reset with ``code``; the connection goes on."""

    def __init__(self, stream_id: int, code: int, message: str) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview) -> bytes:
    """One frame: its header, then ``payload``."""
    n = len(payload)
    return HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def unpad(flags: int, payload: bytes) -> bytes:
    """The payload of a DATA or HEADERS frame without its padding (§6.1); padding as long as the frame is a
    PROTOCOL_ERROR."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "bad padding")
    return payload[1:len(payload) - payload[0]]
