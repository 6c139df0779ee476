"""Writing streamed tokens straight from the engine driver to the client's socket.

A streaming request gets one SSE event per token. Waking its handler task for every
token and going through `StreamResponse.write` costs several microseconds of Python
per token, which at 8 servers x 64 sequences is most of the simulator's CPU. Instead,
once the handler has sent the headers through aiohttp, it installs a `TokenSink` as
the sequence's waiter; the driver calls the sink after each step, and the sink frames
the new events (HTTP/1.1 chunked encoding, exactly as aiohttp frames them) and writes
them to the transport synchronously. The handler only wakes when the request finishes
(or the client has gone), then finishes the response through aiohttp as usual.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.sim.engine import Seq
    from bench.sim.tokenizer import OutputText

__all__ = ["TokenSink"]


class TokenSink:
    """Called by the driver with a sequence that has new tokens or has finished."""

    __slots__ = ("transport", "prefix", "suffix", "chunked", "sent", "done", "broken", "_text")

    def __init__(
        self,
        transport: asyncio.Transport | None,
        output: OutputText,
        prefix: bytes,
        suffix: bytes,
        *,
        chunked: bool,
    ) -> None:
        self.transport = transport
        self.prefix = prefix
        self.suffix = suffix
        self.chunked = chunked
        self.sent = 0
        self.broken = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._text = output

    def __call__(self, seq: Seq) -> None:
        n = seq.num_output
        if n > self.sent:
            transport = self.transport
            if transport is None or transport.is_closing():
                self.broken = True
                self._finish()
                return
            pieces = self._text.json_pieces(seq.out_start, self.sent, n - self.sent)
            prefix, suffix = self.prefix, self.suffix
            if len(pieces) == 1:
                data = prefix + pieces[0] + suffix
            else:
                data = b"".join([prefix + p + suffix for p in pieces])
            self.sent = n
            transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)
        if seq.finished:
            self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
