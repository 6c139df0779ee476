"""A model server that applies a transfer coding other than chunked (``Transfer-Encoding: gzip, chunked``).

EPP never asks for one (it sends no ``TE``), and Transfer-Encoding is hop-by-hop: relaying the de-chunked bytes
used to hand the client gzip data with nothing saying so. Both upstream clients (the ``transport`` fixture runs
each) now refuse such an answer at its head, like any malformed answer: a 502 in OpenAI format, after a retry on
another endpoint when there is one. Each model server is a raw TCP server writing the exact bytes under test.
"""

from __future__ import annotations

import asyncio
import gzip

import orjson
import pytest

from epp.framework.endpoint import EndpointSpec
from epp.gateway._client import LeanUpstream
from epp.gateway._upstream import UpstreamUnavailable

from .helpers import MODEL, RawServer, chat, random_config, sim, spec_for

COMPLETION = orjson.dumps({"id": "c1", "object": "chat.completion", "model": MODEL, "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]})
EVENTS = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'

CODINGS = {
    "gzip-chunked": b"Transfer-Encoding: gzip, chunked\r\n",
    "gzip-line-then-chunked-line": b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
    "chunked-twice": b"Transfer-Encoding: chunked, chunked\r\n",
    "unknown-coding-chunked": b"Transfer-Encoding: x-custom, chunked\r\n",
}


def coded_answer(te_lines: bytes, *, stream: bool) -> bytes:
    """A 200 answer whose body is gzip-compressed and then chunked, announced with ``te_lines``."""
    content_type = b"text/event-stream" if stream else b"application/json"
    body = gzip.compress(EVENTS if stream else COMPLETION)
    return (b"HTTP/1.1 200 OK\r\nContent-Type: %b\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n"
            % (content_type, te_lines, len(body), body))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("te_lines", list(CODINGS.values()), ids=list(CODINGS))
async def test_answer_with_a_transfer_coding_other_than_chunked_is_a_502(stack, te_lines, stream):
    async with RawServer(coded_answer(te_lines, stream=stream)) as ep:
        st = await stack(random_config(), [ep.spec], upstream_timeout=5.0)
        status, body = await asyncio.wait_for(st.post("/v1/chat/completions", chat(stream=stream)), 5)
    assert status == 502, body
    err = body["error"]
    assert err["type"] == "server_error" and err["code"] == "upstream_unavailable"
    assert "Transfer-Encoding" in err["message"]
    assert st.recorder.infos[-1].status == 502 and st.inflight() == 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_answer_with_gzip_transfer_coding_is_retried_on_another_endpoint(sims, stack, stream):
    [healthy] = await sims(sim())
    raw = RawServer(coded_answer(CODINGS["gzip-chunked"], stream=stream))
    async with raw as ep:
        st = await stack(random_config(2), [EndpointSpec("gzip", "127.0.0.1", ep.spec.port), spec_for(healthy)])
        results = await asyncio.gather(*(st.post("/v1/chat/completions", chat(max_tokens=2, stream=stream))
                                         for _ in range(16)))
    assert [status for status, _ in results] == [200] * 16
    if stream:
        assert all(text.rstrip().endswith("data: [DONE]") for _, text in results)
    else:
        assert {answer["object"] for _, answer in results} == {"chat.completion"}
    assert {ep.name for _, ep, _ in st.recorder.done} == {spec_for(healthy).name}
    assert raw.requests  # each request went there first with probability 1/2, and was retried


async def test_lean_client_refuses_the_head_and_does_not_reuse_the_connection():
    raw = RawServer(coded_answer(CODINGS["gzip-chunked"], stream=False))
    up = LeanUpstream()
    async with raw as ep:
        for _ in range(2):
            with pytest.raises(UpstreamUnavailable, match="Transfer-Encoding"):
                await asyncio.wait_for(up.post(ep, "/v1/chat/completions", b"{}", {}), 5)
    await up.close()
    assert raw.connections == 2
