"""The lean front end (``epp.gateway._frontend``) on requests an audit found mishandled: a path that is not valid
UTF-8 once percent-decoded (raw non-ASCII bytes in the target llhttp refuses), HTTP/1.1 without ``Host``, empty
lines before a request line, bare-LF heads, and transfer codings other than ``chunked``.

Raw bytes on a socket, answers parsed by h11 (the ``Conn`` client of ``test_gw_http1_server``).
"""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from epp.errors import EppError

from .helpers import Stack, random_config, sim, spec_for
from .test_gw_h1request import parse_one
from .test_gw_http1_server import Conn, assert_openai_error, chunked, completion, json_request, raw_request

PROMPT_ANSWER_TIMEOUT = 1.0
"""Seconds within which an error answer must come (the keep-alive timeout is 75 s, the head limit 128 KiB)."""


@pytest.fixture
def transport() -> str:
    """Only EPP's own server and client here (the conftest's ``transport`` runs both front ends)."""
    return "lean"


@pytest.fixture
async def gw(stack, sims) -> Stack:
    [server] = await sims(sim())
    return await stack(random_config(), [spec_for(server)], body_limit=4096)


async def open_conn(gw: Stack) -> Conn:
    return await Conn.open(gw.server.port)


async def assert_refused(gw: Stack, data: bytes, status: int = 400, method: str = "GET") -> None:
    """``data`` gets ``status`` in OpenAI format promptly, the connection closes, and nothing reached routing."""
    conn = await open_conn(gw)
    await conn.send(data)
    answer = await conn.answer(method, timeout=PROMPT_ANSWER_TIMEOUT)
    assert_openai_error(answer, status, type_="invalid_request_error")
    assert await conn.closed_by_server() == b""
    assert gw.recorder.done == [] and gw.inflight() == 0


async def health_on_new_connection(gw: Stack) -> None:
    conn = await open_conn(gw)
    assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200
    conn.close()


# -- 1: a path that is not UTF-8 once decoded ----------------------------------------------------------------


@pytest.mark.parametrize("target", [b"/%ff", b"/v1/%C0%AF", b"/v1/chat/%ffcompletions?x=%ff"],
                         ids=["pct-ff", "overlong-slash", "inference-prefix"])
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_path_not_utf8_once_decoded_is_a_404_like_any_unknown_path(gw, caplog, method, target):
    caplog.set_level(logging.ERROR, logger="epp")
    conn = await open_conn(gw)
    body = b"{}" if method == "POST" else b""
    length = b"Content-Length: 2\r\n" if body else b""
    answer = await conn.request(b"%b %b HTTP/1.1\r\nHost: x\r\n%b\r\n%b" % (method.encode(), target, length, body),
                                method)
    assert_openai_error(answer, 404, type_="not_found_error")
    assert "\ufffd" in answer.json()["error"]["message"]
    assert not answer.must_close
    assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200
    conn.close()
    assert not caplog.records, [r.getMessage() for r in caplog.records]


async def test_raw_non_ascii_bytes_in_the_target_are_400(gw):
    """llhttp refuses bytes outside ASCII in a request target (RFC 9112 §3.2: a target is percent-encoded)."""
    await assert_refused(gw, b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n")
    await health_on_new_connection(gw)


def test_routing_path_is_replaced_text_and_the_raw_target_is_kept() -> None:
    req = parse_one(b"GET /a%ff%fe/%63?q=%ff HTTP/1.1\r\nHost: x")
    assert req.path == "/a\ufffd\ufffd/c"
    assert req.raw_path == "/a%ff%fe/%63?q=%ff"


# -- 2: Host --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [
    b"GET /health HTTP/1.1\r\n\r\n",
    b"GET http://gw/health HTTP/1.1\r\nConnection: keep-alive\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
    % (len(orjson.dumps(completion())), orjson.dumps(completion())),
    b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
], ids=["get", "absolute-form", "post", "two-hosts"])
async def test_http11_request_without_exactly_one_host_is_400(gw, data):
    await assert_refused(gw, data)
    await health_on_new_connection(gw)


# -- 3: empty lines before a request line ---------------------------------------------------------------------


async def test_empty_lines_before_a_request_line_are_ignored(gw):
    conn = await open_conn(gw)
    answer = await conn.request(b"\r\n\r\n" + raw_request("GET", "/health"), "GET")
    assert answer.status == 200 and answer.json() == {"status": "ok"}
    await conn.send(b"\r")  # a CRLF split across reads
    await asyncio.sleep(0.05)
    await conn.send(b"\n" + json_request("/v1/completions", completion()))
    answer = await conn.answer("POST")
    assert answer.status == 200 and answer.json()["object"] == "text_completion"
    conn.close()


async def test_empty_lines_between_pipelined_requests_are_ignored(gw):
    conn = await open_conn(gw)
    await conn.send(json_request("/v1/completions", completion()) + b"\r\n"
                    + raw_request("GET", "/health") + b"\r\n\r\n" + raw_request("GET", "/ready"))
    first = await conn.answer("POST")
    assert first.status == 200 and first.json()["object"] == "text_completion"
    assert (await conn.answer("GET")).status == 200
    assert (await conn.answer("GET")).status in (200, 503)
    assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200
    conn.close()


# -- 4: bare LF -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [
    b"GET /health HTTP/1.1\nHost: x\n\n",
    b"GET /health HTTP/1.1\nHost: x\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\n{}",
], ids=["all-lf", "lf-then-crlf", "blank-lf"])
async def test_head_with_bare_lf_line_ends_is_400_at_once(gw, data):
    await assert_refused(gw, data)


# -- 5: transfer codings --------------------------------------------------------------------------------------


TE_REFUSED = {
    "gzip-chunked": b"Transfer-Encoding: gzip, chunked\r\n",
    "gzip-line-then-chunked-line": b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
    "chunked-twice": b"Transfer-Encoding: chunked, chunked\r\n",
    "chunked-then-gzip": b"Transfer-Encoding: chunked, gzip\r\n",
}


TE_STATUS = {"gzip-chunked": 501, "gzip-line-then-chunked-line": 501, "chunked-twice": 400, "chunked-then-gzip": 400}


@pytest.mark.parametrize("name", list(TE_REFUSED))
async def test_transfer_coding_other_than_chunked_is_refused(gw, name):
    """Codings before a final chunked are not implemented (501, RFC 9112 §6.1); chunked not final, or twice,
    leaves the body's end unknown (400)."""
    body = orjson.dumps(completion())
    await assert_refused(gw, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%b"
                             b"\r\n%b" % (TE_REFUSED[name], chunked(body)), TE_STATUS[name], "POST")


def test_transfer_coding_refusals_in_the_parser() -> None:
    for te in TE_REFUSED.values():
        with pytest.raises(EppError):
            parse_one(b"POST / HTTP/1.1\r\nHost: x\r\n" + te.rstrip())
    assert parse_one(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:  Chunked ").headers["transfer-encoding"] \
        == "Chunked"
