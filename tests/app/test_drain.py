"""The reference's drain window (``--drain-timeout``): on a stop signal readiness goes NOT_SERVING at once while
ext_proc and the gateway keep serving, new streams and requests included; after the window the graceful stop
refuses new streams and lets running ones finish, with the health service answering until then; a second signal
ends the window. Outside Kubernetes the window defaults to a few seconds when ext_proc is served (Envoy's health
check must notice first), and a real ``epp serve`` process logs every step in order. Real servers on 127.0.0.1,
a real grpc ext_proc client and the simulator."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.grpc.health.v1 import health_pb2
from epp.cli.main import build_parser
from epp.cli.serve import options_from_args, serve_until_signalled
from epp.extproc.protocol import METHOD_PATH, BodySendMode, pb
from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EXTPROC_DRAIN_TIMEOUT, EppApp, ServeOptions
from epp_sim import SimConfig, SimPool, SimServer

from ..conftest import eventually

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
DESTINATION = "x-gateway-destination-endpoint"
CHAT = b'{"model":"sim-model","messages":[{"role":"user","content":"hello there"}],"max_tokens":2}'


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    async with SimPool([SimConfig(model="sim-model", time_scale=0.01)]) as pool:
        yield pool.servers[0]


def _options(sim: SimServer, transport: str = "native", **kwargs: object) -> ServeOptions:
    return ServeOptions(endpoints=[EndpointSpec(name="sim-0", address="127.0.0.1", port=sim.port)],
                        host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=None, http_port=0,
                        plaintext=True, extproc_transport=transport, refresh_interval=0.02,
                        **kwargs)  # type: ignore[arg-type]


# -- a minimal ext_proc and health client -----------------------------------------------------------------------

def _headers(path: str = "/v1/chat/completions", eos: bool = False,
             mode: int = BodySendMode.FULL_DUPLEX_STREAMED) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest()
    fields = {":method": "GET" if eos else "POST", ":path": path, ":authority": "gw",
              "content-type": "application/json"}
    msg.request_headers.headers.CopyFrom(base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in fields.items()]))
    msg.request_headers.end_of_stream = eos
    msg.protocol_config.request_body_mode = mode  # type: ignore[assignment]
    msg.protocol_config.response_body_mode = BodySendMode.FULL_DUPLEX_STREAMED  # type: ignore[assignment]
    return msg


def _body(data: bytes, eos: bool = True) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest()
    msg.request_body.body = data
    msg.request_body.end_of_stream = eos
    return msg


def _open(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
    return channel.stream_stream(METHOD_PATH, request_serializer=pb.ProcessingRequest.SerializeToString,
                                 response_deserializer=pb.ProcessingResponse.FromString)()


def _destination(reply: pb.ProcessingResponse) -> str:
    return {o.header.key: o.header.raw_value.decode()
            for o in reply.request_headers.response.header_mutation.set_headers}[DESTINATION]


async def _routed(app: EppApp) -> str:
    """One chat request on a new ext_proc connection and stream: the endpoint EPP routed it to."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.extproc.port}") as channel:
        call = _open(channel)
        await call.write(_headers())
        await call.write(_body(CHAT))
        head = await call.read()
        call.cancel()
    return _destination(head)


async def _refused(port: int) -> bool:
    """Whether a new ext_proc stream on a new connection to ``port`` fails."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = _open(channel)
        try:
            await call.write(_headers("/v1/models", eos=True))
            return await call.read() is grpc.aio.EOF
        except grpc.aio.AioRpcError:
            return True
        finally:
            call.cancel()


async def _readiness(app: EppApp) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.extproc.health_port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                    response_deserializer=health_pb2.HealthCheckResponse.FromString)
        return int((await check(health_pb2.HealthCheckRequest(service="readiness"))).status)


async def _ready_is(app: EppApp, status: int) -> bool:
    try:
        return await _readiness(app) == status
    except grpc.aio.AioRpcError:  # not listening yet
        return False


# -- the drain window -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("transport", ["native", "grpcio"])
async def test_during_the_window_new_streams_and_requests_are_served_while_not_ready(sim: SimServer,
                                                                                    transport: str) -> None:
    app = EppApp(_options(sim, transport, drain_timeout=3600.0))
    await app.start()
    try:
        await app.wait_ready()
        assert await _readiness(app) == SERVING
        interrupt = asyncio.Event()
        draining = asyncio.create_task(app.drain(interrupt))
        await eventually(lambda: _ready_is(app, NOT_SERVING))
        assert await _routed(app) == f"127.0.0.1:{sim.port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(app.gateway.url + "/ready") as resp:
                assert resp.status == 503 and "draining" in (await resp.json())["reason"]
            async with session.post(app.gateway.url + "/v1/chat/completions", data=CHAT) as resp:
                assert resp.status == 200 and (await resp.json())["usage"]["completion_tokens"] == 2
        assert not draining.done()
        interrupt.set()  # what a second signal does
        await draining
    finally:
        await app.stop()


@pytest.mark.parametrize("transport", ["native", "grpcio"])
async def test_after_the_window_new_streams_are_refused_and_running_ones_finish(sim: SimServer,
                                                                              transport: str) -> None:
    app = EppApp(_options(sim, transport, drain_timeout=0.05))
    await app.start()
    stopping = None
    try:
        await app.wait_ready()
        port = app.extproc.port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            running = _open(channel)
            await running.write(_headers())
            await running.write(_body(CHAT[:5], eos=False))
            await eventually(lambda: app.extproc.active_streams == 1)
            await app.drain()  # the window elapses on its own
            stopping = asyncio.create_task(app.stop())
            await eventually(lambda: _refused(port))
            assert await _readiness(app) == NOT_SERVING  # health answers while ext_proc finishes its streams
            await running.write(_body(CHAT[5:], eos=True))
            assert _destination(await running.read()) == f"127.0.0.1:{sim.port}"
            await running.read()
            await running.done_writing()
            assert await running.read() is grpc.aio.EOF
            await stopping
        assert app.datastore.endpoints()[0].inflight_requests == 0
    finally:
        if stopping is not None:
            await stopping
        await app.stop()


async def test_a_second_signal_ends_the_window(sim: SimServer) -> None:
    app = EppApp(_options(sim, drain_timeout=3600.0))
    serving = asyncio.create_task(serve_until_signalled(app, banner=False))
    try:
        # The handlers are in place before the app starts, so once health answers a signal is safe to send.
        await eventually(lambda: app.gateway is not None and app.extproc is not None and app.extproc.health_port)
        await eventually(lambda: _ready_is(app, SERVING))
        os.kill(os.getpid(), signal.SIGTERM)
        await eventually(lambda: _ready_is(app, NOT_SERVING))
        assert await _routed(app) == f"127.0.0.1:{sim.port}"
        assert not serving.done()
        port = app.extproc.port
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(serving, 60)  # a guard against a hang, not a timing check
        assert await _refused(port)
    finally:
        if not serving.done():
            serving.cancel()
        await app.stop()


# -- a real process: the order of the steps and their log lines -------------------------------------------------

class _Serve:
    """``epp serve`` as a child process on port 0, its log in a file (INFO, the default level)."""

    def __init__(self, sim: SimServer, tmp_path: Path, *extra: str) -> None:
        endpoints = tmp_path / "endpoints.yaml"
        endpoints.write_text(f"endpoints:\n  - {{name: sim-0, address: 127.0.0.1, port: {sim.port}}}\n")
        self.log_path = tmp_path / "epp.log"
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(endpoints), "--host", "127.0.0.1",
                 "--grpc-port", "0", "--health-port", "0", "--metrics-port", "-1", "--http-port", "0",
                 "--plaintext", *extra], stdout=out, stderr=subprocess.STDOUT)
        self.port = self.health_port = 0
        self.gateway = ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def started(self) -> None:
        """Wait for the banner and read the ports from it."""
        await eventually(lambda: "epp serving:" in self.log() or self.proc.poll() is not None, timeout=30.0)
        banner = re.search(r"ext_proc :(\d+) \(plaintext\), health :(\d+); gateway (\S+)", self.log())
        assert banner is not None, self.log()
        self.port, self.health_port, self.gateway = int(banner[1]), int(banner[2]), banner[3]

    async def logged(self, text: str) -> None:
        await eventually(lambda: text in self.log(), timeout=60.0)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


async def _health_watch(port: int, seen: list[int]) -> None:
    """Record each status the health service's ``Watch`` streams for readiness."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                     request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                     response_deserializer=health_pb2.HealthCheckResponse.FromString)
        async for reply in watch(health_pb2.HealthCheckRequest(service="readiness")):
            seen.append(int(reply.status))


async def _check(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                    response_deserializer=health_pb2.HealthCheckResponse.FromString)
        return int((await check(health_pb2.HealthCheckRequest(service="readiness"))).status)


async def _routed_on(port: int) -> str:
    """One chat request on a new connection to ``port``: the endpoint EPP routed it to."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = _open(channel)
        await call.write(_headers())
        await call.write(_body(CHAT))
        head = await call.read()
        call.cancel()
    return _destination(head)


_STEPS = ["SIGTERM received: shutting down",
          "readiness is NOT_SERVING from now on (gRPC health and the gateway's /ready)",
          f"draining for {EXTPROC_DRAIN_TIMEOUT:g}s (the default with ext_proc",
          "drain window elapsed after",
          "ext_proc: refusing new streams (GOAWAY) and closing the listener; 1 stream(s) open",
          "ext_proc stopped after",
          "EPP stopped"]


@pytest.mark.parametrize("transport", ["native", "grpcio"])
async def test_sigterm_goes_not_serving_first_serves_through_the_default_window_then_stops_and_logs_it(
        sim: SimServer, tmp_path: Path, transport: str) -> None:
    """Without Kubernetes, with ext_proc served and no --drain-timeout: SIGTERM turns readiness NOT_SERVING at
    once (a health Watch sees it) while new streams and gateway requests are still served for the default window;
    then new streams are refused while one opened before the signal finishes; the process exits 0 and its log
    names every step, in order."""
    epp = _Serve(sim, tmp_path, "--extproc-transport", transport)
    watching: asyncio.Task[None] | None = None
    try:
        await epp.started()
        await eventually(lambda: _health_is(epp.health_port, SERVING))
        seen: list[int] = []
        watching = asyncio.create_task(_health_watch(epp.health_port, seen))
        await eventually(lambda: seen)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{epp.port}") as channel:
            held = _open(channel)  # a BUFFERED stream: EPP continues the headers at once, so it is open in EPP
            await held.write(_headers(mode=BodySendMode.BUFFERED))
            assert (await held.read()).HasField("request_headers")
            epp.proc.send_signal(signal.SIGTERM)
            await eventually(lambda: seen[-1] == NOT_SERVING)
            # NOT_SERVING came first: new streams on new connections and gateway requests are still served.
            assert await _routed_on(epp.port) == f"127.0.0.1:{sim.port}"
            async with aiohttp.ClientSession() as session:
                async with session.get(epp.gateway + "/ready") as resp:
                    assert resp.status == 503
                async with session.post(epp.gateway + "/v1/chat/completions", data=CHAT) as resp:
                    assert resp.status == 200
            await epp.logged("ext_proc: refusing new streams")
            await eventually(lambda: _refused(epp.port))
            assert await _check(epp.health_port) == NOT_SERVING  # health answers while a stream is running
            await held.write(_body(CHAT))
            reply = await held.read()
            assert {o.header.key: o.header.raw_value.decode() for o in
                    reply.request_body.response.header_mutation.set_headers}[DESTINATION] == f"127.0.0.1:{sim.port}"
            await held.done_writing()
            assert await held.read() is grpc.aio.EOF
        assert await asyncio.to_thread(epp.proc.wait, 60) == 0, epp.log()
        log = epp.log()
        where = [log.find(step) for step in _STEPS]
        assert -1 not in where and where == sorted(where), (where, log)
        assert "gateway: stopped accepting connections" in log and "gateway stopped after" in log, log
    finally:
        if watching is not None:
            watching.cancel()
        epp.close()


async def _health_is(port: int, status: int) -> bool:
    try:
        return await _check(port) == status
    except grpc.aio.AioRpcError:
        return False


async def test_workers_drain_through_the_window_when_the_whole_process_group_gets_sigterm(tmp_path: Path) -> None:
    """``--workers 2`` stopped by SIGTERM to its process group (systemd's control-group kill, ``timeout``, Ctrl-C):
    each worker gets the signal directly and again from the parent, and that copy does not end its drain window."""
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text("endpoints:\n  - {name: a, address: 127.0.0.1, port: 9}\n")
    log_path = tmp_path / "epp.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(endpoints), "--workers", "2", "--host",
             "127.0.0.1", "--grpc-port", "0", "--health-port", "0", "--metrics-port", "-1", "--plaintext",
             "--drain-timeout", "1s"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        await eventually(lambda: log_path.read_text().count("epp serving:") == 2 or proc.poll() is not None,
                         timeout=90.0)
        os.killpg(proc.pid, signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    log = log_path.read_text()
    assert log.count("SIGTERM received: shutting down") == 2, log
    assert log.count("drain window elapsed after") == 2 and "cut short" not in log, log


async def test_signals_repeated_until_the_process_is_gone_still_give_a_clean_exit(sim: SimServer,
                                                                                  tmp_path: Path) -> None:
    """A supervisor that repeats SIGTERM until the process is gone: the second ends the window, the ones that land
    after the stop (while the interpreter tears down) are ignored, and the exit status stays 0."""
    epp = _Serve(sim, tmp_path)
    try:
        await epp.started()
        while epp.proc.poll() is None:
            epp.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.02)
        assert epp.proc.wait() == 0, epp.log()
        assert "EPP stopped" in epp.log()
    finally:
        epp.close()


def test_a_repeat_of_the_first_signal_within_the_grace_is_the_forwarded_copy() -> None:
    from epp.cli.serve import _ShutdownSignals

    copies = _ShutdownSignals(repeat_grace=3600.0)
    copies.received(signal.SIGTERM)
    copies.received(signal.SIGTERM)
    assert copies.stop.is_set() and not copies.interrupt.is_set()
    copies.received(signal.SIGINT)  # another signal is a second signal
    assert copies.interrupt.is_set()
    plain = _ShutdownSignals()  # not a worker: any repeat ends the window
    plain.received(signal.SIGTERM)
    plain.received(signal.SIGTERM)
    assert plain.interrupt.is_set()


# -- the flags ------------------------------------------------------------------------------------------------

def parse(*args: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["serve", *args])


@pytest.mark.parametrize(("text", "seconds"), [("45s", 45.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0),
                                               ("0", 0.0), ("2.5", 2.5)])
def test_drain_timeout_takes_go_durations(text: str, seconds: float) -> None:
    options = options_from_args(parse("--endpoints", "e.yaml", "--drain-timeout", text))
    assert options.drain_timeout == seconds
    assert EppApp(options).drain_timeout == seconds  # given, it applies with any endpoint source


@pytest.mark.parametrize(("source", "window"), [(("--pool-name", "llama"), 30.0),
                                                (("--endpoint-selector", "app=vllm", "--endpoint-target-ports",
                                                  "8000"), 30.0),
                                                (("--endpoints", "e.yaml"), EXTPROC_DRAIN_TIMEOUT),
                                                (("--endpoints", "e.yaml", "--http-port", "0", "--grpc-port", "-1"),
                                                 0.0)])
def test_the_drain_window_defaults_to_30s_with_kubernetes_else_a_few_seconds_with_ext_proc(
        source: tuple[str, ...], window: float) -> None:
    """Outside Kubernetes the window is :data:`EXTPROC_DRAIN_TIMEOUT` when ext_proc is served (Envoy's health
    check must see NOT_SERVING before the replica refuses streams) and 0 for a gateway alone."""
    options = options_from_args(parse(*source))
    assert options.drain_timeout is None
    assert EppApp(options).drain_timeout == window


@pytest.mark.parametrize("text", ["-5s", "5 parsecs", "s"])
def test_a_bad_drain_timeout_is_a_usage_error(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse("--endpoints", "e.yaml", "--drain-timeout", text)
    assert exit_info.value.code == 2 and "--drain-timeout" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [("--allow-experimental-plugins",), ("--allow-experimental-plugins=true",),
                                  ("--allow-experimental-plugins=false",)])
def test_allow_experimental_plugins_parses_and_changes_nothing(flag: tuple[str, ...]) -> None:
    assert options_from_args(parse("--pool-name", "p", *flag)) == options_from_args(parse("--pool-name", "p"))
