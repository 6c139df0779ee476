"""``epp serve --scheduler-extender-port``: the flag, the workers' ports, and the process answering kube-scheduler."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from epp.cli.main import build_parser
from epp.cli.serve import options_from_args, worker_grpc_ports, worker_options
from epp.runtime.app import ServeOptions
from epp.runtime.ports import free_ports

from ..conftest import eventually


def options(*args: str) -> ServeOptions:
    return options_from_args(build_parser().parse_args(["serve", "--endpoints", "e.yaml", *args]))


@pytest.mark.parametrize("args, port", [((), None), (("--scheduler-extender-port", "9010"), 9010),
                                        (("--scheduler-extender-port", "0"), 0),
                                        (("--scheduler-extender-port", "-1"), None)],
                         ids=["off-by-default", "port", "any-free-port", "minus-one-off"])
def test_the_flag_sets_the_port(args: tuple[str, ...], port: int | None) -> None:
    assert options(*args).scheduler_extender_port == port


def test_an_out_of_range_port_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--scheduler-extender-port", "70000"])
    assert "port 70000 is out of range" in capsys.readouterr().err


def test_workers_skip_the_extender_port_and_only_worker_0_serves_it() -> None:
    opts = options("--grpc-port", "9002", "--health-port", "9003", "--scheduler-extender-port", "9004")
    assert worker_grpc_ports(opts, 3) == [9002, 9005, 9006]
    assert worker_options(opts, 0, 3).scheduler_extender_port == 9004
    assert worker_options(opts, 1, 3).scheduler_extender_port is None


async def test_serve_answers_kube_scheduler_and_refuses_bad_input(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text("endpoints:\n  - {name: a, address: 127.0.0.1, port: 9, node: gpu-a}\n")
    port = free_ports()
    proc = subprocess.Popen([sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(endpoints), "--host",
                             "127.0.0.1", "--grpc-port", "-1", "--health-port", "-1", "--metrics-port", "-1",
                             "--scheduler-extender-port", str(port), "--log-level", "WARNING"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:

            async def prioritize() -> list | None:
                try:
                    async with session.post(url + "/prioritize",
                                            data=b'{"Pod":{"metadata":{}},"Nodes":null,"NodeNames":["gpu-a"]}') as r:
                        return orjson.loads(await r.read()) if r.status == 200 else None
                except aiohttp.ClientConnectionError:
                    return None

            # nothing answers on port 9: the endpoint is unknown, so its node has no known headroom
            assert await eventually(prioritize, "the extender answering", interval=0.1) == [
                {"Host": "gpu-a", "Score": 0}]
            async with session.post(url + "/filter", data=b'{"Pod": {"metadata": ') as resp:
                assert resp.status == 400
                assert "ExtenderArgs: the body is not JSON" in orjson.loads(await resp.read())["Error"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert f"scheduler extender :{port}" in out, out
