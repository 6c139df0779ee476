"""Both front ends refuse the same malformed requests the same way: the status from EPP's error table, an
OpenAI-style JSON error body of the same type and code, and a closed connection.

The same bytes go to EPP's own server and to aiohttp's (``GatewayServer(frontend=...)``) on raw sockets; answers
are parsed by h11 (the ``Conn`` client of ``test_gw_http1_server``). Messages may differ (each parser words its
own); what a client acts on may not. Cases aiohttp cannot be made to answer like EPP's server are listed in
``docs/gateway.md`` and left out here.
"""

from __future__ import annotations

import orjson
import pytest

from .helpers import Stack, random_config, sim, spec_for
from .test_gw_frontend_hardening import TE_REFUSED, TE_STATUS
from .test_gw_http1_server import _GOOD, _POST, MALFORMED, Answer, Conn, chunked, raw_request

_HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n"
_CHUNKED_POST = _POST + b"Transfer-Encoding: chunked\r\n\r\n"
_FILLER = b"".join(b"X-Filler-%06d: %b\r\n" % (i, b"v" * 1000) for i in range(300))

CASES: dict[str, tuple[bytes, int]] = {
    **{name: (data, 400) for name, data in MALFORMED.items()},
    # request line
    "lower-case-method": (b"get /health HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "http-2.0": (b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 400),
    "http-0.9": (b"GET /health HTTP/0.9\r\nHost: x\r\n\r\n", 400),
    "http-1.x": (b"GET /health HTTP/1.x\r\nHost: x\r\n\r\n", 400),
    "request-line-over-128-KiB": (b"GET /health?" + b"a" * (140 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    # header syntax
    "space-before-colon": (b"GET /health HTTP/1.1\r\nHost : x\r\n\r\n", 400),
    "obsolete-line-folding": (_HEALTH + b"X-A: a\r\n b\r\n\r\n", 400),
    "bare-lf": (b"GET /health HTTP/1.1\nHost: x\n\n", 400),
    "no-host": (b"GET /health HTTP/1.1\r\n\r\n", 400),
    "nul-in-value": (_HEALTH + b"X-A: a\x00b\r\n\r\n", 400),
    "lone-cr-in-value": (_HEALTH + b"X-A: a\rb\r\n\r\n", 400),
    "lone-lf-in-value": (_HEALTH + b"X-A: a\nb\r\n\r\n", 400),
    "two-hosts": (b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    "header-over-128-KiB": (_HEALTH + b"X-Big: " + b"v" * (140 * 1024) + b"\r\n\r\n", 400),
    "head-over-128-KiB-unterminated": (_HEALTH + _FILLER, 400),
    # Content-Length
    "negative-content-length": (_POST + b"Content-Length: -2\r\n\r\n{}", 400),
    # chunked framing (in the same read as the head)
    "chunk-not-followed-by-crlf": (_CHUNKED_POST + b"2\r\n{}XX0\r\n\r\n", 400),
    "chunk-size-overflow": (_CHUNKED_POST + b"ffffffffffffffffffff\r\n{}\r\n0\r\n\r\n", 400),
    # transfer codings
    "chunked-in-http-1.0": (b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n" + chunked(_GOOD), 400),
    **{f"te-{name}": (_POST + TE_REFUSED[name] + b"\r\n" + chunked(_GOOD), TE_STATUS[name])
       for name in TE_REFUSED if name != "gzip-line-then-chunked-line"},  # aiohttp: 400 (docs/gateway.md)
}


@pytest.fixture
def transport() -> str:
    """The upstream client does not matter here; each test starts both front ends itself."""
    return "lean"


@pytest.fixture
async def gateways(stack, sims) -> dict[str, Stack]:
    """The same gateway (one simulated model server, 4 KiB body limit) on each front end."""
    [server] = await sims(sim())
    return {frontend: await stack(random_config(), [spec_for(server)], body_limit=4096, frontend=frontend)
            for frontend in ("lean", "aiohttp")}


async def refused(gw: Stack, data: bytes) -> tuple[Answer, bytes]:
    """Send ``data`` on a new connection; the answer and what came before the server closed the connection."""
    conn = await Conn.open(gw.server.port)
    try:
        await conn.send(data)
    except ConnectionError:
        pass  # the server may answer and close before all of an oversized head is in
    answer = await conn.answer("GET" if data.startswith(b"GET") else "POST")
    return answer, await conn.closed_by_server()


def shape(answer: Answer) -> tuple[object, ...]:
    """What a client acts on: status, content type, the error object's keys, type, code and param."""
    err = orjson.loads(answer.body)["error"]
    assert isinstance(err["message"], str) and err["message"], err
    return (answer.status, (answer.header("content-type") or "").split(";")[0], sorted(err), err["type"],
            err["code"], err["param"])


@pytest.mark.parametrize(("data", "status"), list(CASES.values()), ids=list(CASES))
async def test_malformed_request_gets_the_same_openai_error_from_both_front_ends(gateways, data, status):
    shapes = {}
    for frontend, gw in gateways.items():
        answer, after = await refused(gw, data)
        shapes[frontend] = shape(answer)
        assert after == b"", frontend  # the connection was closed after the answer
        assert gw.recorder.done == [] and gw.inflight() == 0
    assert shapes["lean"] == shapes["aiohttp"]
    assert shapes["lean"][:2] == (status, "application/json")


async def test_a_refused_request_leaves_other_connections_served(gateways):
    for gw in gateways.values():
        await refused(gw, b"GARBAGE\r\n\r\n")
        conn = await Conn.open(gw.server.port)
        answer = await conn.request(raw_request("GET", "/health"), "GET")
        assert answer.status == 200 and answer.json() == {"status": "ok"}
        conn.close()
