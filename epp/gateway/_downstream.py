"""The client side of one gateway request, as the proxy drives it, whichever HTTP server carries it.

Two servers implement :class:`Downstream`: EPP's own HTTP/1.1 server (``epp.gateway._frontend``, the default)
and aiohttp's (``epp.gateway._app.AiohttpDownstream``). The proxy (``_proxy``) only ever talks to this contract,
so a request's life is the same on both.
"""

from __future__ import annotations

import asyncio
from typing import Mapping, Protocol

__all__ = ["Downstream", "HeaderItems"]

HeaderItems = Mapping[str, str]
"""Response headers to send (any mapping with ``items()``; a ``CIMultiDict`` keeps repeated names)."""


class Downstream(Protocol):
    """One client request and its response.

    Contract, in call order:

    * ``path`` (percent-decoded, without the query), ``raw_path`` (as received, query included: what is
      forwarded upstream), ``headers`` (lower-case names; of a repeated name the last value) are set on creation.
    * :meth:`read_body` at most once.
    * Then exactly one answer: :meth:`respond` (a complete response), or :meth:`open_stream` (or, where
      ``opens_now`` is true, :meth:`open_stream_now` from a callback) followed, unless it was given
      ``end=True``, by relaying through ``transport`` (framed as chunks when ``chunked``) with :meth:`drain` for
      backpressure, and then :meth:`end_stream` or :meth:`abort`.
    * Every send raises ``ConnectionResetError`` when the client has gone away. The server cancels the task
      serving a request whose client disconnected.

    The server adds ``Content-Length`` or ``Transfer-Encoding`` itself; ``headers`` passed in must not carry
    hop-by-hop or length headers (``_upstream.client_headers`` removes them).
    """

    path: str
    raw_path: str
    headers: dict[str, str]
    transport: asyncio.Transport | None
    chunked: bool
    opens_now: bool
    """Whether :meth:`open_stream_now` works (the server can start a stream without awaiting anything)."""

    async def read_body(self, limit: int) -> bytes:
        """The whole request body; ``PayloadTooLarge`` when it exceeds ``limit`` bytes."""

    async def respond(self, status: int, headers: HeaderItems, body: bytes) -> None:
        """Send a complete response."""

    async def open_stream(self, status: int, headers: HeaderItems, first: bytes, *, end: bool) -> None:
        """Send the head of a streamed response together with its first body bytes (and, with ``end``, the
        end of the body). Afterwards ``transport`` and ``chunked`` are valid."""

    def open_stream_now(self, status: int, headers: HeaderItems, first: bytes) -> None:
        """:meth:`open_stream` without ``end``, callable from a callback (an upstream read): only where
        ``opens_now`` is true."""

    async def drain(self) -> None:
        """Wait until the client's write buffer is below its low-water mark."""

    async def end_stream(self, tail: bytes) -> None:
        """Send the last body bytes with the end-of-body marker."""

    def abort(self) -> None:
        """Drop the client connection (a stream that broke upstream must not look complete)."""
