"""The composed application (``epp serve``): static discovery, scraping, both front ends and the metrics port,
driven end to end with the official ``openai`` client against simulated vLLM servers."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import aiohttp
import openai
import pytest

from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimPool

from ..conftest import eventually


@pytest.fixture
async def pool():  # type: ignore[no-untyped-def]
    async with SimPool([SimConfig(model="sim-model", time_scale=0.01, seed=i) for i in range(3)]) as p:
        yield p


@pytest.fixture
async def app(pool, tmp_path: Path):  # type: ignore[no-untyped-def]
    lines = ["endpoints:"]
    for i, server in enumerate(pool.servers):
        lines += [f"  - name: sim-{i}", "    address: 127.0.0.1", f"    port: {server.port}"]
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text("\n".join(lines) + "\n")
    options = ServeOptions(endpoints_file=str(endpoints), host="127.0.0.1", grpc_port=0, health_port=0,
                           metrics_port=0, http_port=0, plaintext=True, refresh_interval=0.02)
    epp = EppApp(options)
    await epp.start()
    await epp.wait_ready()
    yield epp
    await epp.stop()


async def test_serve_routes_openai_requests_and_exports_metrics(app: EppApp) -> None:
    await eventually(lambda: all(ep.metrics.update_time > 0 for ep in app.datastore.endpoints()))
    client = openai.AsyncOpenAI(base_url=app.gateway.url + "/v1", api_key="unused", max_retries=0)
    try:
        chat = await client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "hello " * 50}], max_tokens=8)
        assert chat.choices[0].message.content and chat.usage.completion_tokens == 8
        chunks = [c async for c in await client.completions.create(
            model="sim-model", prompt="stream me", max_tokens=5, stream=True, stream_options={"include_usage": True})]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    finally:
        await client.close()
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{app.metrics_port}/metrics") as resp:
            text = await resp.text()
        async with session.get(f"http://127.0.0.1:{app.metrics_port}/debug/tenants") as resp:
            assert resp.status == 200
    assert 'inference_objective_request_total{model_name="sim-model"' in text
    assert "inference_pool_ready_pods" in text
    assert "inference_extension_scheduler_e2e_duration_seconds_count" in text
    # the chat prompt spans several 64-character blocks; "stream me" is shorter than one, so it has no ratio
    assert "inference_extension_prefix_indexer_hit_ratio_count 1.0" in text
    assert 'inference_objective_normalized_time_per_output_token_seconds_count{model_name="sim-model"' in text
    # the current reference's names (llm-d dashboards), recorded together with the deprecated ones
    # (subsystem llm_d_epp; the request families also by the request's fairness id and priority)
    assert 'inference_objective_request_total{model_name="sim-model",priority="0",target_model_name="sim-model"} 2.0' \
        in text
    F = 'fairness_id="default-flow",model_name="sim-model",priority="0",target_model_name="sim-model"'
    assert f'llm_d_epp_request_total{{{F}}} 2.0' in text
    assert f'llm_d_epp_request_ntpot_seconds_count{{{F}}} 2.0' in text
    assert f'llm_d_epp_request_running{{{F}}} 0.0' in text
    assert f'llm_d_epp_request_input_tokens_count{{{F}}} 2.0' in text
    assert 'llm_d_epp_ready_endpoints{name="static-pool"} 3.0' in text
    assert "# HELP inference_objective_request_total [Deprecated: Use llm_d_epp_request_total] " in text
    assert "# HELP inference_objective_request_sizes [Deprecated: Use llm_d_epp_request_size_bytes] " in text
    assert "llm_d_router_epp_" not in text
    assert all(ep.inflight_requests == 0 for ep in app.datastore.endpoints())


async def test_serve_answers_bad_input_with_openai_errors(app: EppApp) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(app.gateway.url + "/v1/chat/completions", data=b"{oops") as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["type"] == "invalid_request_error"


async def test_static_file_reload_keeps_serving(app: EppApp, pool, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = Path(app.options.endpoints_file)
    path.write_text(f"endpoints:\n  - name: only\n    address: 127.0.0.1\n    port: {pool.servers[0].port}\n")
    await eventually(lambda: [ep.name for ep in app.datastore.endpoints()] == ["only"])
    path.write_text("endpoints: [this is: not valid\n")
    await asyncio.sleep(0.3)
    assert [ep.name for ep in app.datastore.endpoints()] == ["only"]


@pytest.mark.parametrize("frontend", ["lean", "aiohttp"])
async def test_http_frontend_option_selects_the_gateway_server(pool, tmp_path: Path, frontend: str) -> None:  # type: ignore[no-untyped-def]
    from epp.cli.main import build_parser
    from epp.cli.serve import options_from_args

    args = build_parser().parse_args(["serve", "--http-port", "0", "--grpc-port", "-1", "--metrics-port", "-1",
                                      "--host", "127.0.0.1", "--http-frontend", frontend])
    options = options_from_args(args)
    assert options.http_frontend == frontend
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text("endpoints:\n" + "".join(
        f"  - name: sim-{i}\n    address: 127.0.0.1\n    port: {s.port}\n" for i, s in enumerate(pool.servers)))
    epp = EppApp(dataclasses.replace(options, endpoints_file=str(endpoints), health_port=0))
    await epp.start()
    try:
        await epp.wait_ready()
        assert epp.gateway.frontend == frontend
        client = openai.AsyncOpenAI(base_url=epp.gateway.url + "/v1", api_key="unused", max_retries=0)
        try:
            chat = await client.chat.completions.create(
                model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        finally:
            await client.close()
        assert chat.usage is not None and chat.usage.completion_tokens == 3
    finally:
        await epp.stop()


def test_shutdown_grace_reaches_both_front_ends() -> None:
    """``--shutdown-grace`` (default 30 s, Kubernetes' termination grace period) is how long running requests
    may take to finish on SIGTERM, on the ext_proc server and the gateway alike."""
    from epp.cli.main import build_parser
    from epp.cli.serve import options_from_args

    parse = build_parser().parse_args
    assert options_from_args(parse(["serve", "--endpoints", "e.yaml"])).shutdown_grace == 30.0
    options = options_from_args(parse(["serve", "--endpoints", "e.yaml", "--http-port", "0", "--shutdown-grace",
                                       "12.5"]))
    app = EppApp(dataclasses.replace(options, endpoints=[]))
    app.director = _director_for(app)
    assert app._extproc().shutdown_grace == 12.5  # type: ignore[attr-defined]
    assert app._gateway().shutdown_timeout == 12.5  # type: ignore[attr-defined]


def test_serve_takes_the_reference_flag_names_and_go_durations(capsys) -> None:
    """``--endpoint-target-ports`` and Go durations (``50ms``, ``1m30s``) as llm-d-router's flags take them; the
    older ``--target-ports`` and plain seconds still work; a bad duration is a usage error naming the flag."""
    from epp.cli.main import build_parser
    from epp.cli.serve import options_from_args

    parse = build_parser().parse_args
    options = options_from_args(parse(["serve", "--endpoint-selector", "app=x", "--endpoint-target-ports",
                                       "8000,8001", "--refresh-metrics-interval", "50ms", "--shutdown-grace",
                                       "1m30s"]))
    assert (options.target_ports, options.refresh_interval, options.shutdown_grace) == ([8000, 8001], 0.05, 90.0)
    options = options_from_args(parse(["serve", "--endpoint-selector", "app=x", "--target-ports", "8000",
                                       "--refresh-metrics-interval", "0.02"]))
    assert (options.target_ports, options.refresh_interval) == ([8000], 0.02)
    for flag, value, needle in (("--refresh-metrics-interval", "soon", "invalid duration 'soon'"),
                                ("--refresh-metrics-interval", "0s", "more than zero"),
                                ("--shutdown-grace", "-5s", "invalid duration")):
        with pytest.raises(SystemExit) as info:
            parse(["serve", "--endpoints", "e.yaml", f"{flag}={value}"])
        err = capsys.readouterr().err
        assert info.value.code == 2 and f"argument {flag}: " in err and needle in err


def _director_for(app: EppApp):  # type: ignore[no-untyped-def]
    from epp.scheduling.director import Director

    return Director(app.pipeline, app.datastore)


def test_serve_sets_the_gateways_upstream_timeout_connect_timeout_and_retries(capsys) -> None:
    """The HTTP gateway's 504 deadline, connect timeout and retry count are ``epp serve`` flags (Go durations or
    seconds); 0 means no upstream timeout; a retry count outside 0-10 is a usage error naming the flag."""
    from epp.cli.main import build_parser
    from epp.cli.serve import options_from_args

    parse = build_parser().parse_args
    options = options_from_args(parse(["serve", "--endpoints", "e.yaml", "--upstream-timeout", "2m",
                                       "--connect-timeout", "500ms", "--retries", "0"]))
    assert (options.upstream_timeout, options.connect_timeout, options.retries) == (120.0, 0.5, 0)
    defaults = options_from_args(parse(["serve", "--endpoints", "e.yaml"]))
    assert (defaults.upstream_timeout, defaults.connect_timeout, defaults.retries) == (300.0, 5.0, 1)
    assert options_from_args(parse(["serve", "--endpoints", "e.yaml", "--upstream-timeout", "0"])).upstream_timeout \
        is None
    with pytest.raises(SystemExit) as info:
        parse(["serve", "--endpoints", "e.yaml", "--retries", "11"])
    assert info.value.code == 2 and "argument --retries: 11 is out of range" in capsys.readouterr().err


async def test_the_gateway_answers_504_after_the_upstream_timeout_given_to_epp_serve(tmp_path) -> None:
    """``ServeOptions.upstream_timeout`` (``--upstream-timeout``) reaches the gateway: a model server that never
    answers gets the client a 504 after it."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await asyncio.sleep(30)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    app = EppApp(ServeOptions(endpoints=[EndpointSpec("s", "127.0.0.1", port)], host="127.0.0.1", grpc_port=None,
                              health_port=None, metrics_port=None, http_port=0, upstream_timeout=0.3, retries=0))
    await app.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(app.gateway.url + "/v1/completions", json={"model": "m", "prompt": "hi"}) as resp:
                assert resp.status == 504
    finally:
        await app.stop()
        server.close()


async def test_stop_makes_readiness_not_serving_while_the_gateway_still_drains() -> None:
    """Both front ends drain together: while a gateway request is still running after stop() began, the ext_proc
    health already says NOT_SERVING (the gateway's drain used to run first, with readiness SERVING meanwhile)."""
    arrived, release = asyncio.Event(), asyncio.Event()

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"POST"):  # the metrics scraper: no page, the endpoint just looks stale
            writer.close()
            return
        arrived.set()
        await release.wait()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(held, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    app = EppApp(ServeOptions(endpoints=[EndpointSpec("s", "127.0.0.1", port)], host="127.0.0.1", grpc_port=0,
                              health_port=0, metrics_port=None, http_port=0, plaintext=True, shutdown_grace=30.0))
    await app.start()
    try:
        async with aiohttp.ClientSession() as session:
            request = asyncio.create_task(session.post(app.gateway.url + "/v1/completions",
                                                       json={"model": "m", "prompt": "hi"}))
            await arrived.wait()
            stopping = asyncio.create_task(app.stop())
            for _ in range(200):
                if app.extproc.health.status("readiness") != 1:  # 1 = SERVING
                    break
                await asyncio.sleep(0.01)
            assert app.extproc.health.status("readiness") == 2 and not stopping.done()  # 2 = NOT_SERVING
            release.set()
            async with await request as resp:
                assert resp.status == 200
            await stopping
    finally:
        await app.stop()
        server.close()
