"""SSE streaming of completions, with tokens written straight from the engine driver
to the client's socket.

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
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

if TYPE_CHECKING:
    from bench.sim.engine import Seq
    from bench.sim.server import SimServer
    from bench.sim.tokenizer import OutputText

__all__ = ["TokenSink", "stream_response", "usage"]

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_DONE = b"data: [DONE]\n\n"


def usage(seq: Seq) -> dict[str, Any]:
    """OpenAI `usage` of a request, with vLLM's `prompt_tokens_details.cached_tokens`."""
    return {
        "prompt_tokens": seq.num_prompt,
        "total_tokens": seq.num_prompt + seq.num_output,
        "completion_tokens": seq.num_output,
        "prompt_tokens_details": {"cached_tokens": seq.cached_tokens},
    }


def _event(head: dict[str, Any], choice: dict[str, Any]) -> bytes:
    body = {**head, "choices": [{"index": 0, "logprobs": None, **choice}]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def stream_response(
    srv: SimServer,
    request: web.Request,
    seq: Seq,
    head: dict[str, Any],
    chat: bool,
    include_usage: bool,
) -> web.StreamResponse:
    """Answer `seq` as an SSE stream of OpenAI chunks; `head` = id, object, created, model."""
    common = orjson.dumps(head)[:-1] + b',"choices":[{"index":0,'
    if chat:
        prefix = b"data: " + common + b'"delta":{"content":'
        suffix = b'},"logprobs":null,"finish_reason":null}]}\n\n'
    else:
        prefix = b"data: " + common + b'"text":'
        suffix = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    client_id = request.headers.get("x-request-id")
    if client_id:
        resp.headers["x-request-id"] = client_id
    try:
        await resp.prepare(request)
        if chat:
            first = {"role": "assistant", "content": ""}
            await resp.write(_event(head, {"delta": first, "finish_reason": None}))
        elif not getattr(resp, "_send_headers_immediately", True):
            await resp.write(b": \n\n")  # flush buffered headers with an SSE comment
        chunked = resp.headers.get("Transfer-Encoding") == "chunked"
        sink = TokenSink(request.transport, srv.output, prefix, suffix, chunked=chunked)
        seq.waiter = sink
        sink(seq)  # tokens produced while the headers were being sent
        await sink.done
        if sink.broken:
            srv.abort(seq)
            return resp
        last: dict[str, Any] = {"finish_reason": seq.finish_reason}
        if chat:
            last["delta"] = {}
        else:
            last.update(text="", stop_reason=None)
        tail = [_event(head, last)]
        if include_usage:
            tail.append(b"data: " + orjson.dumps({**head, "choices": [], "usage": usage(seq)}))
            tail.append(b"\n\n")
        tail.append(_DONE)
        await resp.write(b"".join(tail))
        await resp.write_eof()
    except asyncio.CancelledError:
        srv.abort(seq)
        raise
    except ConnectionError:
        srv.abort(seq)  # the client went away mid-stream
    return resp


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
            data = self._encode(self._text.json_pieces(seq.out_start, self.sent, n - self.sent))
            self.sent = n
            transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)
        if seq.finished:
            self._finish()

    def _encode(self, pieces: list[bytes]) -> bytes:
        """The SSE bytes for the new tokens' JSON-escaped text ``pieces`` (one event per token)."""
        prefix, suffix = self.prefix, self.suffix
        if len(pieces) == 1:
            return prefix + pieces[0] + suffix
        return b"".join([prefix + p + suffix for p in pieces])

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
