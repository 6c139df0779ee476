"""The lean front end (``epp.gateway._frontend``) on requests an audit found mishandled: HTTP/1.1 without ``Host``.

Raw bytes on a socket, answers parsed by h11 (the ``Conn`` client of ``test_gw_http1_server``).
"""

from __future__ import annotations

import orjson
import pytest

from gw_helpers import Stack, random_config, sim, spec_for
from test_gw_http1_server import Conn, assert_openai_error, completion, raw_request

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
