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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

if TYPE_CHECKING:
    from .backend import SimBackend
    from .engine import Seq
    from .tokenizer import OutputText

__all__ = ["TokenSink", "abort_if_gone", "relay_tokens", "running_usage", "stream_response", "usage"]

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


def running_usage(seq: Seq, completion_tokens: int) -> dict[str, int]:
    """The ``usage`` vLLM puts in every chunk with ``continuous_usage_stats``: counts so far, in UsageInfo's field
    order, without ``prompt_tokens_details`` (vLLM sets that only on the final usage chunk)."""
    return {"prompt_tokens": seq.num_prompt, "total_tokens": seq.num_prompt + completion_tokens,
            "completion_tokens": completion_tokens}


def _event(head: dict[str, Any], choice: dict[str, Any], extra: dict[str, Any] | None = None) -> bytes:
    body = {**head, "choices": [{"index": 0, "logprobs": None, **choice}], **(extra or {})}
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def stream_response(
    srv: SimBackend,
    request: web.Request,
    seq: Seq,
    head: dict[str, Any],
    chat: bool,
    include_usage: bool,
    *,
    continuous_usage: bool = False,
) -> web.StreamResponse:
    """Answer `seq` as an SSE stream of OpenAI chunks; `head` = id, object, created, model. ``include_usage`` adds
    a last chunk with the usage; ``continuous_usage`` puts the usage so far in every chunk as well (vLLM's
    ``stream_options.continuous_usage_stats``)."""
    common = orjson.dumps(head)[:-1] + b',"choices":[{"index":0,'
    if chat:
        prefix = b"data: " + common + b'"delta":{"content":'
        choice_end = b'},"logprobs":null,"finish_reason":null}]'
    else:
        prefix = b"data: " + common + b'"text":'
        choice_end = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]'
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    client_id = request.headers.get("x-request-id")
    if client_id:
        resp.headers["x-request-id"] = client_id
    counts = (lambda n: {"usage": running_usage(seq, n)}) if continuous_usage else (lambda n: None)
    with abort_if_gone(srv, seq):
        await resp.prepare(request)
        if not getattr(resp, "_send_headers_immediately", True):
            await resp.write(b": \n\n")  # flush buffered headers with an SSE comment
        chunked = resp.headers.get("Transfer-Encoding") == "chunked"
        sink_type = _UsageSink if continuous_usage else TokenSink
        sink = sink_type(request.transport, srv.output, prefix, choice_end + b"}\n\n", chunked=chunked)
        if chat:  # vLLM yields the role chunk on its first engine output, i.e. with the first token (its TTFT)
            sink.preamble = _event(head, {"delta": {"role": "assistant", "content": ""}, "finish_reason": None},
                                   counts(0))
        if not await relay_tokens(srv, seq, sink):
            return resp
        last: dict[str, Any] = {"finish_reason": seq.finish_reason}
        if chat:
            last["delta"] = {}
        else:
            last.update(text="", stop_reason=None)
        tail = [sink.preamble, _event(head, last, counts(seq.num_output))]  # the role chunk if no token came
        if include_usage:
            tail.append(b"data: " + orjson.dumps({**head, "choices": [], "usage": usage(seq)}))
            tail.append(b"\n\n")
        tail.append(_DONE)
        await resp.write(b"".join(tail))
        await resp.write_eof()
    return resp


@contextmanager
def abort_if_gone(srv: SimBackend, seq: Seq) -> Iterator[None]:
    """Around a stream's writes: ``seq`` is aborted when the request is cancelled (re-raised) or the client's
    connection fails (the stream just ends)."""
    try:
        yield
    except asyncio.CancelledError:
        srv.abort(seq)
        raise
    except ConnectionError:
        srv.abort(seq)  # the client went away mid-stream


async def relay_tokens(srv: SimBackend, seq: Seq, sink: TokenSink) -> bool:
    """Make ``sink`` the waiter of ``seq``, hand it the tokens produced while the stream's first bytes were being
    sent, and wait for the sequence to end; False (and ``seq`` aborted) when the client went away meanwhile."""
    seq.waiter = sink
    sink(seq)
    await sink.done
    if sink.broken:
        srv.abort(seq)
        return False
    return True


class TokenSink:
    """Called by the driver with a sequence that has new tokens or has finished."""

    __slots__ = ("transport", "prefix", "suffix", "chunked", "sent", "done", "broken", "preamble", "_text")

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
        self.preamble = b""
        """Bytes sent just before the first token's event, in the same write (chat's role chunk)."""
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
            if self.preamble:
                data, self.preamble = self.preamble + data, b""
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


class _UsageSink(TokenSink):
    """A :class:`TokenSink` whose chunks also carry the usage so far (``continuous_usage_stats``): the n-th token's
    chunk says ``completion_tokens: n``, so each chunk gets its own suffix."""

    __slots__ = ("prompt", "choice_end")

    def __init__(self, transport: asyncio.Transport | None, output: OutputText, prefix: bytes, suffix: bytes, *,
                 chunked: bool) -> None:
        super().__init__(transport, output, prefix, suffix, chunked=chunked)
        self.prompt = -1
        self.choice_end = suffix.removesuffix(b"}\n\n")

    def __call__(self, seq: Seq) -> None:
        self.prompt = seq.num_prompt
        super().__call__(seq)

    def _encode(self, pieces: list[bytes]) -> bytes:
        head, end, prompt = self.prefix, self.choice_end, self.prompt
        return b"".join(
            b'%b%b%b,"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}\n\n'
            % (head, piece, end, prompt, prompt + n, n)
            for n, piece in enumerate(pieces, self.sent + 1)
        )
