"""The gateway benchmarks' fixed model server: an OpenAI-compatible aiohttp app that answers after a fixed latency
with a fixed number of tokens, so the CPU a proxy in front of it spends is the proxy's own (a few µs per request
here). ``bench.http_gateway`` runs four of them in its ``_backend`` process; the per-request gauges
(``bench.http_instructions``, ``bench.http_syscalls``) use the same process.
"""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

__all__ = ["MODEL", "FixedBackend", "StepClock"]

MODEL = "bench-model"


def _chunk(i: int, chat: bool) -> bytes:
    if chat:
        payload = {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                   "choices": [{"index": 0, "delta": {"content": f" tok{i}"}, "logprobs": None,
                                "finish_reason": None}]}
    else:
        payload = {"id": "cmpl-b", "object": "text_completion", "created": 0, "model": MODEL,
                   "choices": [{"index": 0, "text": f" tok{i}", "logprobs": None, "finish_reason": None}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class StepClock:
    """A model server's engine steps: a regular clock of ``period`` seconds (offset by ``phase``) that every
    stream in the batch waits on, so the tokens of one step are written in the same event-loop iteration, as
    vLLM's continuous batching emits one token per running request per step. Ticks only while awaited."""

    def __init__(self, period: float, phase: float = 0.0) -> None:
        self.period = period
        self.phase = phase
        self._next: asyncio.Future[None] | None = None
        self.boundary = -1.0
        """The loop time of the last step scheduled (``phase + k * period``)."""
        self.ticks = 0
        """Steps taken so far."""

    def step(self) -> asyncio.Future[None]:
        """A future that completes at the next step boundary (shared by every stream waiting for it).

        Boundaries are ``phase + k * period``, and each tick takes the boundary after the last one's, even when
        the loop's timer fired a little early (uvloop's timers have millisecond resolution)."""
        if self._next is None:
            loop = asyncio.get_running_loop()
            self._next = loop.create_future()
            now = loop.time()
            at = max(now + self.period - (now - self.phase) % self.period, self.boundary + self.period)
            self.boundary = at
            loop.call_at(at, self._tick)
        return self._next

    def _tick(self) -> None:
        fut, self._next = self._next, None
        self.ticks += 1
        if fut is not None and not fut.done():
            fut.set_result(None)


class FixedBackend:
    """An OpenAI-compatible server answering after ``latency`` seconds with ``tokens`` tokens.

    Streams send their first token after half the latency and the others spread over the other half: one
    timer per stream (``pacing="request"``: tokens of different streams reach a proxy one at a time), or on a
    shared :class:`StepClock` of the same period (``pacing="step"``: the tokens of all streams in the batch
    leave together, as from vLLM)."""

    def __init__(self, latency: float, tokens: int, pacing: str = "request", phase: float = 0.0) -> None:
        self.latency = latency
        self.tokens = tokens
        self.gap = latency / 2 / max(1, tokens - 1)
        self.clock = StepClock(self.gap, phase * self.gap) if pacing == "step" and self.gap else None
        self.chunks = {chat: [_chunk(i, chat) for i in range(tokens)] for chat in (True, False)}
        usage = {"prompt_tokens": 300, "completion_tokens": tokens, "total_tokens": 300 + tokens,
                 "prompt_tokens_details": {"cached_tokens": 0}}
        self.usage_chunk = b"data: " + orjson.dumps({"id": "b", "choices": [], "model": MODEL,
                                                     "usage": usage}) + b"\n\n"
        text = "".join(f" tok{i}" for i in range(tokens))
        self.answers = {
            True: orjson.dumps({"id": "chatcmpl-b", "object": "chat.completion", "created": 0, "model": MODEL,
                                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                             "finish_reason": "length"}], "usage": usage}),
            False: orjson.dumps({"id": "cmpl-b", "object": "text_completion", "created": 0, "model": MODEL,
                                 "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                                 "usage": usage}),
        }

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        chat = request.path.endswith("/chat/completions")
        if not body.get("stream"):
            if self.latency:
                await asyncio.sleep(self.latency)
            return web.Response(body=self.answers[chat], content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        gap, clock = self.gap, self.clock
        if self.latency:
            await asyncio.sleep(self.latency / 2)
        for i, chunk in enumerate(self.chunks[chat]):
            if clock is not None:
                await clock.step()
            elif i and gap:
                await asyncio.sleep(gap)
            await resp.write(chunk)
        tail = (self.usage_chunk if (body.get("stream_options") or {}).get("include_usage") else b"")
        await resp.write(tail + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
