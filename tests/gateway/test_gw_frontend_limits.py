"""The lean front end's deadlines and caps on clients (``ClientLimits``, the ``epp serve --http-*`` flags), each
with small values on a real server: a trickled head is closed at the head deadline, a stalled or too slow body
is closed, an idle connection closes counted from its last answer, connections over the cap get 503 while the
open ones keep being served (also on uvloop, production's loop, whose transports differ), pipelined bytes read
while a request is served stay bounded, unfinished requests past the server-wide bytes budget get 503, refused
input is followed by a lingering close that real clients read the answer through, and the head limit.

Every wait is for a condition with a deadline; nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import openai
import orjson
import pytest

from epp.cli.main import build_parser
from epp.cli.serve import options_from_args
from epp.config.loader import build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.gateway import GatewayServer, make_gateway_app
from epp.gateway import _frontend as frontend
from epp.gateway._frontend import ClientLimits
from epp.runtime.app import EppApp, ServeOptions
from epp.scheduling.director import Director

from ..conftest import eventually
from .helpers import MODEL, random_config, sim
from .test_gw_http1_server import (  # noqa: F401
    Conn,
    Gw,
    assert_openai_error,
    completion,
    gateway,
    health_ok,
    json_request,
    raw_request,
    slow_sim,
)

CLOSE_WAIT = 10.0
"""Seconds a test waits for the server to close a connection (the deadlines under test are at most 1 s)."""


async def trickle(conn: Conn, data: bytes, every: float, step: int = 1) -> int:
    """Write ``data`` ``step`` bytes every ``every`` seconds until done or the server closes; the bytes sent."""
    sent = 0
    try:
        while sent < len(data):
            conn.writer.write(data[sent:sent + step])
            await conn.writer.drain()
            sent += step
            await asyncio.sleep(every)
    except ConnectionError:
        pass
    return min(sent, len(data))


async def closed_while_trickling(conn: Conn, data: bytes, every: float, step: int = 1) -> None:
    """Trickle ``data``: the server closes the connection without an answer before all of it is sent."""
    writer = asyncio.create_task(trickle(conn, data, every, step))
    try:
        assert await conn.closed_by_server(timeout=CLOSE_WAIT) == b""
        assert not writer.done() or writer.result() < len(data), "all was sent: the deadline never fired"
    finally:
        writer.cancel()


def server_connections(gw: Gw) -> list:
    front = gw.server._lean
    assert front is not None
    return list(front.connections)


# -- head deadline ---------------------------------------------------------------------------------------------


async def test_trickled_head_is_closed_at_the_head_deadline(gateway):
    """Bytes come more often than the deadline, so a timer restarted by each byte would never fire."""
    gw = await gateway(client_limits=ClientLimits(header_timeout=0.5))
    conn = await gw.conn()
    head = raw_request("GET", "/health", headers=(("X-Pad", "p" * 2000),))
    await closed_while_trickling(conn, head, every=0.02)
    await health_ok(gw.port)


async def test_head_deadline_does_not_cut_a_request_that_completes(gateway):
    gw = await gateway(client_limits=ClientLimits(header_timeout=5.0))
    conn = await gw.conn()
    await trickle(conn, raw_request("GET", "/health"), every=0.001, step=8)
    answer = await conn.answer("GET")
    assert answer.status == 200 and not answer.must_close
    conn.close()


# -- body deadline ---------------------------------------------------------------------------------------------


async def test_stalled_body_is_closed(gateway):
    gw = await gateway(client_limits=ClientLimits(body_timeout=0.5))
    conn = await gw.conn()
    await conn.send(raw_request("POST", "/v1/completions", headers=(("Content-Type", "application/json"),
                                                                    ("Content-Length", "1000"))) + b'{"model"')
    assert await conn.closed_by_server(timeout=CLOSE_WAIT) == b""
    assert gw.stack.recorder.done == [] and gw.inflight() == 0
    await health_ok(gw.port)


async def test_body_below_the_minimum_rate_is_closed(gateway):
    """A byte every 50 ms never pauses as long as ``body_timeout``, but brings 20 bytes a second of the 1000
    asked."""
    gw = await gateway(client_limits=ClientLimits(body_timeout=0.5, body_min_rate=1000))
    conn = await gw.conn()
    await conn.send(raw_request("POST", "/v1/completions", headers=(("Content-Type", "application/json"),
                                                                    ("Content-Length", "3000"))))
    await closed_while_trickling(conn, b"x" * 3000, every=0.05)
    assert gw.stack.recorder.done == []


async def test_body_at_the_minimum_rate_is_served(gateway):
    """A body that arrives over several ``body_timeout`` periods, each bringing more than the minimum rate."""
    gw = await gateway(body_limit=1 << 20, client_limits=ClientLimits(body_timeout=1.0, body_min_rate=100))
    body = orjson.dumps(completion(user="u" * 3000))
    conn = await gw.conn()
    await conn.send(raw_request("POST", "/v1/completions", headers=(("Content-Type", "application/json"),
                                                                    ("Content-Length", str(len(body))))))
    assert await trickle(conn, body, every=0.1, step=150) == len(body)
    answer = await conn.answer("POST")
    assert answer.status == 200 and answer.json()["object"] == "text_completion"
    conn.close()


# -- keep-alive ------------------------------------------------------------------------------------------------


async def test_idle_connection_closes_from_its_last_answer_whatever_empty_lines_come(gateway):
    """Empty lines before a request line are allowed (RFC 9112 §2.2) but are no request: they do not keep an
    idle connection open."""
    gw = await gateway(keepalive_timeout=0.5)
    conn = await gw.conn()
    answer = await conn.request(raw_request("GET", "/health"), "GET")
    assert answer.status == 200 and not answer.must_close
    writer = asyncio.create_task(trickle(conn, b"\r\n" * 2000, every=0.02, step=2))
    try:
        assert await conn.closed_by_server(timeout=CLOSE_WAIT) == b""
    finally:
        writer.cancel()


async def test_a_head_begun_on_an_idle_connection_has_the_head_deadline(gateway):
    gw = await gateway(keepalive_timeout=60.0, client_limits=ClientLimits(header_timeout=0.5))
    conn = await gw.conn()
    assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200
    await closed_while_trickling(conn, raw_request("GET", "/health", headers=(("X-Pad", "p" * 2000),)), every=0.02)


# -- connection cap --------------------------------------------------------------------------------------------


async def test_connections_over_the_cap_get_503_and_the_open_ones_keep_working(gateway):
    gw = await gateway(client_limits=ClientLimits(max_connections=3))
    open_conns = [await gw.conn() for _ in range(3)]
    for conn in open_conns:
        assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200
    for _ in range(2):
        extra = await gw.conn()
        try:
            await extra.send(raw_request("GET", "/health"))
        except ConnectionError:
            pass  # the refusal may close before the request is in
        answer = await extra.answer("GET")
        assert_openai_error(answer, 503, type_="server_error", code="too_many_connections")
        assert answer.header("retry-after") == "1" and answer.must_close
        assert await extra.closed_by_server() == b""
    assert gw.server._lean is not None and gw.server._lean.refused == 2
    for conn in open_conns:
        assert (await conn.request(raw_request("GET", "/health"), "GET")).status == 200
    proxied = await open_conns[0].request(json_request("/v1/completions", completion()))
    assert proxied.status == 200 and proxied.json()["object"] == "text_completion"
    open_conns.pop().close()
    await eventually(lambda: len(server_connections(gw)) == 2, timeout=CLOSE_WAIT, what="the closed one released")
    await health_ok(gw.port)
    for conn in open_conns:
        conn.close()


async def test_the_cap_holds_for_a_burst_of_connections(gateway):
    """Connections accepted together (before any of them is set up) count against the cap too."""
    gw = await gateway(client_limits=ClientLimits(max_connections=5))
    assert sorted(await burst(gw.port, 30)) == [200] * 5 + [503] * 25


async def burst(port: int, count: int) -> list[int]:
    """Open ``count`` connections at once, send a request on each, and read every answer before closing any (a
    served connection stays open meanwhile); the statuses."""
    conns = await asyncio.gather(*(Conn.open(port) for _ in range(count)))
    for conn in conns:
        try:
            await conn.send(raw_request("GET", "/health"))
        except ConnectionError:
            pass  # a refusal may close before the request is in
    statuses = [(await conn.answer("GET")).status for conn in conns]
    for conn in conns:
        conn.close()
    return statuses


def _director(registry) -> Director:
    """A Director over an empty, synced pool: enough for a gateway started by hand (e.g. on uvloop)."""
    datastore = Datastore()
    datastore.mark_synced()
    return Director(build_pipeline(*load_raw(random_config()), registry), datastore)


def test_refusal_and_cap_on_uvloop(registry):
    """The same on uvloop, production's event loop, whose transports are not ``asyncio.Transport`` subclasses and
    whose accepts come one at a time."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> list[int]:
        async with GatewayServer(make_gateway_app(_director(registry)), "127.0.0.1", 0,
                                 client_limits=ClientLimits(max_connections=3)) as server:
            return await burst(server.port, 10)

    assert sorted(uvloop.run(scenario())) == [200] * 3 + [503] * 7


# -- bytes buffered behind a request ---------------------------------------------------------------------------


async def test_pipelined_bytes_read_while_a_request_is_served_are_bounded(gateway):
    """While a slow stream is served, the client pipelines a 4 MiB body: the server stops reading at the buffer
    (plus the one read that crossed it), and reads the rest once the stream is answered."""
    buffer = 64 * 1024
    gw = await gateway(slow_sim(0.02), body_limit=8 << 20, client_limits=ClientLimits(pipeline_buffer=buffer))
    conn = await gw.conn()
    await conn.send(json_request("/v1/completions", completion(max_tokens=100, stream=True)))
    [server_conn] = server_connections(gw)
    await eventually(lambda: server_conn.task is not None, what="the stream served")
    big = 4 << 20
    writer = asyncio.create_task(conn.send(raw_request("POST", "/nope", headers=(("Content-Length", str(big)),))
                                           + b"x" * big + raw_request("GET", "/health")))
    await eventually(lambda: server_conn._read_paused, timeout=CLOSE_WAIT, what="reading paused")
    assert server_conn.task is not None, "the stream ended before the test could look"
    assert server_conn.parser.held <= buffer + 256 * 1024 + 4096  # one read (at most 256 KiB) crosses the bound
    stream = await conn.answer("POST")
    assert stream.status == 200 and stream.sse_events()[-1] == "data: [DONE]"
    assert_openai_error(await conn.answer("POST"), 404, type_="not_found_error")
    assert (await conn.answer("GET")).status == 200
    await writer
    conn.close()


# -- bytes held over all connections ---------------------------------------------------------------------------


def front_held(gw: Gw) -> int:
    front = gw.server._lean
    assert front is not None
    return front.held


async def test_unfinished_bodies_past_the_budget_get_503_and_the_rest_are_served(gateway):
    """Bodies announced and left unfinished (held until the body deadline) add up over connections: the one that
    takes the total past ``held_budget`` is answered 503 and closed, and its bytes are given back; the others, and
    new requests, are served."""
    gw = await gateway(body_limit=1 << 20, client_limits=ClientLimits(held_budget=100_000))
    body = orjson.dumps(completion(user="u" * 50_000)).ljust(60_000)  # JSON may end in blanks
    head = raw_request("POST", "/v1/completions", headers=(("Content-Type", "application/json"),
                                                           ("Content-Length", str(len(body)))))
    stalled = []
    for _ in range(2):  # 2 x 45,000 bytes held: under the budget
        conn = await gw.conn()
        await conn.send(head + body[:45_000])
        stalled.append(conn)
    await eventually(lambda: front_held(gw) >= 90_000, what="both bodies held")
    over = await gw.conn()
    await over.send(head + body[:45_000])
    answer = await over.answer("POST")
    assert_openai_error(answer, 503)
    assert answer.must_close and answer.header("retry-after") == "1"
    assert await over.closed_by_server(timeout=CLOSE_WAIT) == b""
    await eventually(lambda: front_held(gw) < 100_000, what="the refused connection's bytes given back")
    for conn in stalled:  # their bodies complete: served
        await conn.send(body[45_000:])
        assert (await conn.answer("POST")).status == 200
        conn.close()
    await eventually(lambda: front_held(gw) == 0, what="every held byte given back")
    await health_ok(gw.port)


async def test_a_request_complete_in_one_read_is_served_past_the_budget(gateway):
    """Only a connection left with an unfinished request is refused: a whole request that takes the total past the
    budget in one read is served, and the connection holding the rest keeps its bytes."""
    gw = await gateway(body_limit=1 << 20, client_limits=ClientLimits(held_budget=50_000))
    held = await gw.conn()
    await held.send(raw_request("POST", "/v1/completions", headers=(("Content-Length", "60000"),)) + b"x" * 40_000)
    await eventually(lambda: front_held(gw) >= 40_000, what="the body held")
    body = orjson.dumps(completion(user="u" * 15_000)).ljust(20_000)
    conn = await gw.conn()
    answer = await conn.request(raw_request("POST", "/v1/completions", headers=(
        ("Content-Type", "application/json"), ("Content-Length", str(len(body))))) + body, "POST")
    assert answer.status == 200
    assert front_held(gw) >= 40_000 and gw.server._lean is not None and len(gw.server._lean.connections) == 2
    conn.close()
    held.close()


# -- lingering close after refused input ------------------------------------------------------------------------


@pytest.mark.parametrize("client", ["openai", "aiohttp"])
async def test_a_client_still_sending_a_refused_body_reads_the_413(gateway, client):
    """A real client uploads a prompt far over the body limit. The gateway answers 413 from the head; with an
    immediate close the client's unread bytes reset the connection, and the openai client then raised a connection
    error instead of the 413 (aiohttp's reads an early answer either way). The lingering close reads (and drops)
    the rest until the client is done."""
    gw = await gateway()
    prompt = "x" * (16 << 20)  # far more than the sockets' buffers take in, so the client is still writing
    if client == "openai":
        api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.APIStatusError) as caught:
            await api.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
        await api.close()
        assert caught.value.status_code == 413
        assert caught.value.code == "body_too_large"
    else:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{gw.port}/v1/completions", json=completion(prompt)) as resp:
                assert resp.status == 413
                assert (await resp.json())["error"]["code"] == "body_too_large"
    await eventually(lambda: not server_connections(gw), what="the lingering connection closed after the client's")
    await health_ok(gw.port)


def test_lingering_close_on_uvloop(registry):
    """The same on uvloop, production's event loop (its transports half-close through their own code)."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> int:
        async with GatewayServer(make_gateway_app(_director(registry), body_limit=4096), "127.0.0.1", 0) as server:
            api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="k", max_retries=0)
            try:
                await api.completions.create(model=MODEL, prompt="x" * (16 << 20), max_tokens=1)
            except openai.APIStatusError as err:
                return err.status_code
            finally:
                await api.close()
        return 200

    assert uvloop.run(scenario()) == 413


async def test_a_refused_connection_lingers_while_the_client_sends_and_gives_its_bytes_back(gateway):
    """Refused past the held-bytes budget in the middle of its body, a connection is answered and half-closed; its
    held bytes are given back at once, the client can go on sending without a reset, and the connection is gone
    once the client closes."""
    gw = await gateway(body_limit=1 << 20, client_limits=ClientLimits(held_budget=100_000))
    head = raw_request("POST", "/v1/completions", headers=(("Content-Length", "600000"),))
    held = await gw.conn()
    await held.send(head + b"x" * 60_000)
    await eventually(lambda: front_held(gw) >= 60_000, what="the first body held")
    conn = await gw.conn()
    await conn.send(head + b"x" * 60_000)
    answer = await conn.answer("POST")
    assert_openai_error(answer, 503)
    assert answer.must_close
    assert len(server_connections(gw)) == 2 and front_held(gw) < 100_000  # lingering, its bytes given back
    for _ in range(20):  # the server reads on and drops it: no reset however much more comes
        await conn.send(b"z" * 65_536)
    assert await conn.closed_by_server(timeout=CLOSE_WAIT) == b""  # the server's FIN, nothing after the answer
    conn.close()
    await eventually(lambda: len(server_connections(gw)) == 1, what="closed after the client's close")
    held.close()


async def refused_and_lingering(gateway, monkeypatch, pause: float, most: float) -> tuple[Gw, Conn]:
    """A gateway with the lingering limits set to ``pause`` and ``most`` seconds, and a connection whose garbage was
    answered 400 and that now lingers."""
    monkeypatch.setattr(frontend, "_LINGER_IDLE", pause)
    monkeypatch.setattr(frontend, "_LINGER_TOTAL", most)
    gw = await gateway()
    conn = await gw.conn()
    await conn.send(b"NOT HTTP\r\n\r\n")
    assert (await conn.answer("GET")).status == 400
    return gw, conn


async def test_a_lingering_connection_is_closed_when_its_reads_pause(gateway, monkeypatch):
    """A client that neither sends nor closes after the answer is closed once its reads pause for the lingering
    timeout (shortened here, the lingering time out of reach)."""
    gw, idle = await refused_and_lingering(gateway, monkeypatch, pause=0.3, most=600.0)
    await eventually(lambda: not server_connections(gw), timeout=CLOSE_WAIT, what="the idle lingering connection closed")
    idle.close()


async def test_a_lingering_connection_that_keeps_sending_is_closed_at_the_lingering_time(gateway, monkeypatch):
    """A client that keeps trickling after the answer is closed at the lingering time's end (shortened here, the
    pause timeout out of reach), while it still has bytes to send."""
    gw, trickler = await refused_and_lingering(gateway, monkeypatch, pause=600.0, most=1.0)
    data = b"t" * 10_000  # 500 s of trickle: cut off long before
    writer = asyncio.create_task(trickle(trickler, data, every=0.05))
    try:
        await eventually(lambda: not server_connections(gw), timeout=CLOSE_WAIT,
                         what="the trickling lingering connection closed")
        assert await asyncio.wait_for(writer, CLOSE_WAIT) < len(data)  # its writes fail once the server is gone
    finally:
        writer.cancel()
    trickler.close()


# -- head size -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pad", "status"), [(500, 200), (2000, 400)], ids=["under", "over"])
async def test_head_size_limit(gateway, pad, status):
    gw = await gateway(client_limits=ClientLimits(max_head=1024))
    conn = await gw.conn()
    answer = await conn.request(raw_request("GET", "/health", headers=(("X-Pad", "p" * pad),)), "GET")
    assert answer.status == status
    if status == 400:
        assert_openai_error(answer, 400, type_="invalid_request_error")
        assert await conn.closed_by_server() == b""
    conn.close()


# -- the epp serve flags -----------------------------------------------------------------------------------------


def _serve_options(*flags: str) -> ServeOptions:
    return options_from_args(build_parser().parse_args(["serve", "--endpoints", "e.yaml", *flags]))


def test_serve_flags_set_the_limits() -> None:
    options = _serve_options("--http-header-timeout", "2s", "--http-body-timeout", "1m", "--http-body-min-rate", "0",
                             "--http-max-connections", "100", "--http-max-head-size", "64KiB",
                             "--http-pipeline-buffer", "2MiB", "--http-keepalive-timeout", "5",
                             "--http-held-budget", "64MiB")
    assert ClientLimits(**options.http_client_limits) == ClientLimits(
        header_timeout=2.0, body_timeout=60.0, body_min_rate=0, max_connections=100, max_head=64 * 1024,
        pipeline_buffer=2 << 20, held_budget=64 << 20)
    assert options.http_keepalive_timeout == 5.0
    defaults = _serve_options()
    assert ClientLimits(**defaults.http_client_limits) == ClientLimits() and defaults.http_keepalive_timeout == 75.0
    for bad in (["--http-max-head-size", "0"], ["--http-max-head-size", "12 parsecs"], ["--http-max-connections", "-1"],
                ["--http-body-min-rate", "fast"]):
        with pytest.raises(SystemExit):
            _serve_options(*bad)


async def test_serve_flags_reach_the_gateway(sims, tmp_path) -> None:
    """``epp serve --http-max-connections 1 --http-keepalive-timeout 0.5``: the second connection is refused while
    the first is open, and the first is closed once idle."""
    [server] = await sims(sim())
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(f"endpoints:\n  - name: sim\n    address: 127.0.0.1\n    port: {server.port}\n")
    options = _serve_options("--http-port", "0", "--grpc-port", "-1", "--metrics-port", "-1", "--host", "127.0.0.1",
                              "--http-max-connections", "1", "--http-keepalive-timeout", "0.5")
    app = EppApp(dataclasses.replace(options, endpoints_file=str(endpoints), health_port=None))
    await app.start()
    try:
        first = await Conn.open(app.gateway.port)
        assert (await first.request(raw_request("GET", "/health"), "GET")).status == 200
        assert (await burst(app.gateway.port, 1)) == [503]
        assert await first.closed_by_server(timeout=CLOSE_WAIT) == b""
    finally:
        await app.stop()
