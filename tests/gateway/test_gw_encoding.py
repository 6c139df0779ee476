"""Request bodies with a Content-Encoding: decoded once by the proxy on both front ends and forwarded decoded."""

from __future__ import annotations

import gzip
import zlib

import orjson
import pytest

from epp.errors import BadRequest, PayloadTooLarge
from epp.gateway._encoding import decode_content

from .helpers import MODEL, RawServer, chat, random_config

BODY = orjson.dumps(chat(max_tokens=3))
ANSWER = (b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}')


@pytest.mark.parametrize("coding, encoded", [
    (None, BODY), ("identity", BODY), ("gzip", gzip.compress(BODY)), ("x-gzip", gzip.compress(BODY)),
    ("deflate", zlib.compress(BODY)), (" GZIP ", gzip.compress(BODY)),
])
def test_decode_content_reads_gzip_and_deflate(coding: str | None, encoded: bytes) -> None:
    assert decode_content(encoded, coding, 1 << 20) == BODY


@pytest.mark.parametrize("coding, encoded, error, needle", [
    ("br", b"\x8b\x02\x80", BadRequest, "unsupported Content-Encoding 'br'"),
    ("gzip, br", gzip.compress(BODY), BadRequest, "unsupported Content-Encoding"),
    ("gzip", b"not gzip at all", BadRequest, "not valid gzip"),
    ("gzip", gzip.compress(BODY)[:-12], BadRequest, "truncated"),
    ("gzip", gzip.compress(b" " * 5000), PayloadTooLarge, "exceeds the limit of 4096"),
])
def test_decode_content_refuses_what_it_cannot_read(coding: str, encoded: bytes, error: type, needle: str) -> None:
    with pytest.raises(error, match=needle):
        decode_content(encoded, coding, 4096)


async def test_a_gzip_body_is_routed_and_forwarded_decoded_without_the_header(stack) -> None:
    raw = RawServer(ANSWER)
    async with raw as ep:
        st = await stack(random_config(), [ep.spec])
        status, _ = await st.post("/v1/chat/completions", gzip.compress(BODY),
                                  headers={"content-type": "application/json", "content-encoding": "gzip"})
        assert status == 200
        head, _, forwarded = raw.requests[0].partition(b"\r\n\r\n")
        assert forwarded == BODY and b"content-encoding" not in head.lower()
        assert st.recorder.infos[-1].status == 200 and MODEL.encode() in forwarded


@pytest.mark.parametrize("coding, encoded, status, code", [
    ("br", b"\x8b\x02\x80", 400, "BadRequest"),
    ("gzip", b"garbage", 400, "BadRequest"),
    ("gzip", gzip.compress(b" " * 200_000), 413, "body_too_large"),
])
async def test_a_body_that_cannot_be_decoded_is_refused_with_the_request_id(stack, coding: str, encoded: bytes,
                                                                             status: int, code: str) -> None:
    raw = RawServer(ANSWER)
    async with raw as ep:
        st = await stack(random_config(), [ep.spec], body_limit=100_000)
        async with st.session.post(st.url + "/v1/chat/completions", data=encoded,
                                   headers={"content-type": "application/json", "content-encoding": coding,
                                            "x-request-id": "rid-1"}) as resp:
            body = orjson.loads(await resp.read())
            assert (resp.status, body["error"]["code"], resp.headers.get("x-request-id")) == (status, code, "rid-1")
        assert raw.requests == []


async def test_a_body_over_the_limit_is_refused_by_the_front_end_with_the_request_id(stack) -> None:
    st = await stack(random_config(), [], body_limit=1000)
    async with st.session.post(st.url + "/v1/chat/completions", data=b"x" * 2000,
                               headers={"content-type": "application/json", "x-request-id": "rid-2"}) as resp:
        assert resp.status == 413 and resp.headers.get("x-request-id") == "rid-2"
