"""The simulated pool of one run: one ``epp-sim`` process per server, started fresh for every router (cold caches,
zeroed counters).

Server ``i`` listens on its own loopback address, ``127.0.0.{i+2}``, on a free port, as pods have their own IPs: a
router that finds KV-event publishers by endpoint address (EPP's ``discoverPods``) then reaches each server's own.
Servers run in real time (``time_scale`` 1) in separate processes, so neither the benchmark's client nor a router
shares an event loop with them. Each is configured by a YAML file of :class:`epp_sim.SimConfig` fields: the model, its
P/D role, its time model (a ``slowdown`` multiplies every term) and, on request, a bound KV-event publisher.
``counters()`` reads every server's ``/metrics`` (finished requests, preemptions, prefix-cache counters) and
``/sim/info`` (P/D KV loads that failed); ``info()`` returns ``/sim/info`` whole.
"""

from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.routing.procs import Child, wait_for
from bench.routing.workloads import MODEL, ServerSpec
from epp.runtime.ports import free_ports
from epp_sim import TimeModel

__all__ = ["Counters", "SimFleet", "SimServer", "server_config"]

_LISTENING = re.compile(r"epp-sim listening on http://(\S+):(\d+) ")
_SCALED = ("step_overhead_s", "prefill_s_per_token", "prefill_attn_s_per_pair", "decode_s_per_seq",
           "attn_s_per_kv_token")


@dataclass(frozen=True, slots=True)
class SimServer:
    """A running simulated server."""

    name: str
    host: str
    port: int
    role: str
    kv_events: str | None  # its KV-event publisher's endpoint, if any

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Counters:
    """A server's counters from its ``/metrics``."""

    finished: int = 0
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    kv_load_failures: int = 0  # P/D: decodes that found no prefiller KV to pull and prefilled locally


def server_config(spec: ServerSpec, *, seed: int, kv_events: str | None,
                  tokenizer: Path | None = None) -> dict[str, object]:
    """The ``SimConfig`` fields of one server (the simulator's defaults for everything else); ``tokenizer``: a
    folder with the ``tokenizer.json`` to use instead of the built-in tokenizer."""
    fields: dict[str, object] = {"model": MODEL, "role": spec.role, "seed": seed, "time_scale": 1.0}
    if tokenizer is not None:
        fields["tokenizer"] = str(tokenizer / "tokenizer.json")
    if spec.slowdown != 1.0:
        base = TimeModel()
        fields["time_model"] = {k: getattr(base, k) * spec.slowdown for k in _SCALED}
    if kv_events:
        fields.update(kv_events_endpoint=kv_events, kv_events_bind=True)
    return fields


class SimFleet:
    """The servers of ``specs``; ``kv_events``: each publishes KV events on ``tcp://<its address>:<kv_port>``;
    ``tokenizer``: a folder built by :mod:`bench.routing.tokenizer` (default: the simulator's built-in tokenizer)."""

    def __init__(self, specs: list[ServerSpec], workdir: Path, *, kv_events: bool = False, seed: int = 0,
                 tokenizer: Path | None = None) -> None:
        self.specs, self.workdir, self.seed, self.tokenizer = specs, workdir, seed, tokenizer
        self.kv_port = free_ports() if kv_events else None
        self.servers: list[SimServer] = []
        self._children: list[Child] = []

    async def start(self, timeout: float = 60.0) -> None:
        """Start every server; returns once each has printed its listening line."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        hosts = [f"127.0.0.{i + 2}" for i in range(len(self.specs))]
        for i, (spec, host) in enumerate(zip(self.specs, hosts)):
            kv = f"tcp://{host}:{self.kv_port}" if self.kv_port else None
            config = self.workdir / f"sim-{i}.yaml"
            config.write_text(yaml.safe_dump(server_config(spec, seed=self.seed + i, kv_events=kv,
                                                                tokenizer=self.tokenizer)))
            argv = [sys.executable, "-m", "epp_sim.cli", "--host", host, "--port", "0", "--config", str(config)]
            self._children.append(Child(f"sim-{i}", argv, self.workdir / f"sim-{i}.log").start())
        try:
            ports = await asyncio.gather(*(self._port(child, timeout) for child in self._children))
        except BaseException:
            await self.stop()
            raise
        self.servers = [SimServer(f"sim-{i}", host, port, spec.role, f"tcp://{host}:{self.kv_port}"
                                  if self.kv_port else None)
                        for i, (spec, host, port) in enumerate(zip(self.specs, hosts, ports))]

    async def stop(self) -> None:
        """Stop every server (by its PID)."""
        children, self._children = self._children, []
        await asyncio.gather(*(child.stop() for child in children))

    def pids(self) -> list[int]:
        """Every server's process id, in start order."""
        return [child.pid for child in self._children]

    async def counters(self) -> list[Counters]:
        """Every server's counters, in :attr:`servers` order."""
        async with aiohttp.ClientSession() as session:
            return list(await asyncio.gather(*(_counters(session, s.url) for s in self.servers)))

    async def info(self) -> list[dict[str, object]]:
        """Every server's ``/sim/info`` (configuration and engine counters), in :attr:`servers` order."""
        async with aiohttp.ClientSession() as session:
            return list(await asyncio.gather(*(_info(session, s.url) for s in self.servers)))

    async def served(self) -> list[list[str]]:
        """Every server's ``/sim/served`` (the prompt keys it accepted, in arrival order), in :attr:`servers` order."""
        async with aiohttp.ClientSession() as session:
            return list(await asyncio.gather(*(_served(session, s.url) for s in self.servers)))

    @staticmethod
    async def _port(child: Child, timeout: float) -> int:
        found: list[int] = []

        async def listening() -> bool:
            match = _LISTENING.search(child.output())
            if match:
                found.append(int(match.group(2)))
            return bool(found)

        await wait_for(listening, child, "its listening line", timeout, interval=0.05)
        return found[0]


async def _info(session: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with session.get(url + "/sim/info") as resp:
        resp.raise_for_status()
        info: dict[str, object] = await resp.json()
        return info


async def _served(session: aiohttp.ClientSession, url: str) -> list[str]:
    async with session.get(url + "/sim/served") as resp:
        resp.raise_for_status()
        keys: list[str] = (await resp.json())["served"]
        return keys


async def _counters(session: aiohttp.ClientSession, url: str) -> Counters:
    async with session.get(url + "/metrics") as resp:
        resp.raise_for_status()
        text = await resp.text()
    info = await _info(session, url)
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return Counters(finished=int(totals.get("vllm:request_success_total", 0)),
                    preemptions=int(totals.get("vllm:num_preemptions_total", 0)),
                    prefix_queries=int(totals.get("vllm:prefix_cache_queries_total", 0)),
                    prefix_hits=int(totals.get("vllm:prefix_cache_hits_total", 0)),
                    kv_load_failures=int(str(info.get("kv_load_failures", 0))))
