"""What EPP's own HTTP/1.1 server allows a client, and how it refuses one: :class:`ClientLimits` and the answers
given on the way out.

:class:`ClientLimits` holds the deadlines and caps (``epp serve --http-*``); :func:`default_max_connections` sizes
the connection cap from the file-descriptor limit. :func:`closing_answer` is a complete JSON error response that
announces the connection's close (a 503 :class:`HeldBudgetExceeded` past the bytes budget, for one);
:class:`Refused` is the protocol of a connection over the cap, which gets a 503 (:class:`TooManyConnections`) at
once and is closed after a short linger, unread.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass
from http import HTTPStatus
from types import MappingProxyType
from typing import cast

from epp.errors import EppError, ErrorCode, error_body

__all__ = ["ClientLimits", "default_max_connections", "HeldBudgetExceeded", "TooManyConnections", "Refused",
           "closing_answer", "REASONS"]

REASONS = MappingProxyType({s.value: s.phrase.encode() for s in HTTPStatus})
"""Reason phrases by status, for status lines."""
_REFUSED_LINGER = 1.0  # seconds a refused connection stays open for its answer to be read before the close


@dataclass(frozen=True)
class ClientLimits:
    """What the server allows a client (``epp serve --http-*`` flags). Durations in seconds, 0 = no limit."""

    header_timeout: float = 30.0
    """A request head must be complete this long after its first byte (Kestrel's default; nginx's is 60 s)."""
    body_timeout: float = 60.0
    """A request body may not pause longer than this between reads (nginx's ``client_body_timeout``), and each
    such period must bring ``body_min_rate`` bytes a second."""
    body_min_rate: int = 1024
    """Bytes a second a body must average over each ``body_timeout`` period (0 = any progress will do)."""
    max_connections: int | None = None
    """Open client connections at most (None: :func:`default_max_connections`; 0 = no limit)."""
    max_head: int = 128 * 1024
    """Largest request head (target and fields), trailer section or unfinished line, in bytes."""
    pipeline_buffer: int = 1024 * 1024
    """Bytes of further requests read while one is served before reading pauses."""
    held_budget: int = 256 * 1024 * 1024
    """Bytes of requests not yet served (unfinished bodies, pipelined requests) this process holds over all its
    connections; a connection with an unfinished request that pushes the total over it is answered 503 and closed,
    as Envoy's overload manager sheds load (0 = no limit). Without it the bound is connections x body limit."""


def default_max_connections() -> int:
    """Half the file descriptors the process may open, less a reserve (each client connection may need an upstream
    one too); 0 (no limit) when the limit is unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 0
    return max(16, (soft - 64) // 2)


class TooManyConnections(EppError):
    """503: the server is at its ``max_connections``."""

    code = ErrorCode.SERVICE_UNAVAILABLE
    default_reason = "too_many_connections"


class HeldBudgetExceeded(EppError):
    """503: the requests not yet served hold more bytes than ``held_budget``."""

    code = ErrorCode.SERVICE_UNAVAILABLE
    default_reason = "request_bytes_over_budget"


def closing_answer(err: EppError, headers: bytes, *, anthropic: bool = False) -> bytes:
    """``err`` as a complete JSON error response with ``headers`` (lines) that announces the connection's close."""
    body = error_body(err, anthropic=anthropic)
    return (b"HTTP/1.1 %d %b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%bConnection: close\r\n\r\n%b"
            % (err.status, REASONS.get(err.status, b"Error"), len(body), headers, body))


class Refused(asyncio.Protocol):
    """A connection over the cap: answered at once, then closed once the client closes or after a short linger
    (closing at once with the client's request unread would reset the connection, and a reset can discard the
    answer before the client reads it)."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not asyncio.Transport subclasses)
        transport.write(self.answer)
        if transport.can_write_eof():
            transport.write_eof()
        self.timer = asyncio.get_running_loop().call_later(_REFUSED_LINGER, transport.abort)

    def data_received(self, data: bytes) -> None:
        pass  # the request is not read: it is refused whatever it is

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
