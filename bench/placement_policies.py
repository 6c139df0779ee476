"""Who routes and who places in ``bench.placement``: round-robin or EPP's request path, and kube-scheduler's default
spreading or the scheduler extender's :class:`~epp.extender.placement.NodePlacer`.

- :class:`RoundRobin`: request k goes to server k mod n (the servers in the order they joined).
- :class:`EppRouting`: EPP's own Director over a Datastore of the servers, with the pipeline a config file builds
  (config/default.yaml: queue 2, kv-cache 2, prefix 3, max-score picker) and EPP's default admission (flow control
  off: only sheddable requests, priority < 0, are ever refused, and this workload has none). Every
  ``scrape_interval`` each endpoint's Metrics are replaced by the engine's waiting, running and KV use, as the
  scraper does; in-flight counts are booked and released by the Director. Time is the simulation's.
- :class:`LeastRequested`: kube-scheduler's default scoring for identical pods. Its ``NodeResourcesFit`` scores
  ``LeastAllocated`` over requested CPU and memory, ``BalancedAllocation`` and the default hostname spreading are
  equal for identical pods, so the node with the fewest of the pool's pods wins; ties go to a random one of them,
  as ``selectHost`` breaks them.
- :class:`ExtenderPlacement`: the extender as kube-scheduler calls it: its ``/filter`` over the feasible nodes,
  then its ``/prioritize`` over those left, and the highest score (ties at random; a single node left is taken
  without scoring, as kube-scheduler does). Only the extender scores, so the comparison isolates its policy.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Coroutine, TypeVar

import orjson

from bench.placement_fleet import POOL_LABELS, Request, Server
from epp.config.loader import load_config
from epp.datalayer.datastore import Datastore
from epp.errors import EppError
from epp.extender.placement import NodePlacer
from epp.flowcontrol.legacy import LegacyAdmission
from epp.framework.endpoint import Endpoint, EndpointSpec, Metrics
from epp.framework.plugins import ResponseInfo, SaturationDetector
from epp.runtime.builtins import default_registry
from epp.scheduling.director import Director, RequestContext

__all__ = ["RoundRobin", "EppRouting", "LeastRequested", "ExtenderPlacement", "SimClock", "DEFAULT_CONFIG",
           "MODEL"]

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "config/default.yaml"
MODEL = "sim-model"
_T = TypeVar("_T")


class SimClock:
    """The simulation's clock, for the plugins and the Director that read one."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def set(self, now: float) -> None:
        self.now = now


class RoundRobin:
    """Request k to server k mod n; nothing scraped."""

    scrape_interval: float | None = None

    def __init__(self) -> None:
        self.servers: list[Server] = []
        self._next = 0

    def add_server(self, server: Server) -> None:
        self.servers.append(server)

    def route(self, index: int, request: Request, now: float) -> Server | None:
        server = self.servers[self._next % len(self.servers)]
        self._next += 1
        return server

    def first_token(self, index: int) -> None:
        return None

    def finished(self, index: int, ok: bool, output_tokens: int) -> None:
        return None

    def scrape(self, servers: Sequence[Server], now: float) -> None:
        return None


class EppRouting:
    """EPP's Director and scheduler, built from ``config``, choosing among the servers as EPP sees them."""

    def __init__(self, config: Path, clock: SimClock, seed: int, scrape_interval: float = 0.05) -> None:
        self.scrape_interval: float | None = scrape_interval
        pipeline = load_config(config, default_registry(entry_points=False))
        rng = random.Random(seed)
        for plugin in pipeline.handle.plugins():
            if isinstance(getattr(plugin, "rng", None), random.Random):  # pickers break ties at random: seed them
                setattr(plugin, "rng", random.Random(rng.random()))
            if callable(getattr(plugin, "clock", None)):  # e.g. the saturation detector ages metrics by its clock
                setattr(plugin, "clock", clock)
        self.detector: SaturationDetector = pipeline.saturation_detector
        self.datastore = Datastore()
        self.director = Director(pipeline, self.datastore, LegacyAdmission(self.detector), clock=clock,
                                 rng=random.Random(rng.random()))
        self._servers: dict[str, Server] = {}
        self._contexts: dict[int, RequestContext] = {}

    def endpoints(self) -> list[Endpoint]:
        return self.datastore.endpoints()

    def add_server(self, server: Server) -> None:
        node_ip, slot = server.node.rsplit("-", 1)[1], server.index + 1
        self.datastore.upsert(EndpointSpec(name=server.name, address=f"10.0.{node_ip}.{slot}", port=8000,
                                           labels=dict(POOL_LABELS), node=server.node))
        self._servers[server.name] = server

    def route(self, index: int, request: Request, now: float) -> Server | None:
        # The text stands for the prompt: its length gives EPP's token estimate (4 characters a token) and its
        # unique head keeps the approximate prefix index from matching two requests.
        prompt = f"request {index:08d} ".ljust(4 * request.prompt_len, ".")
        body = orjson.dumps({"model": MODEL, "prompt": prompt, "max_tokens": request.max_tokens})
        try:
            parsed = self.director.parse("/v1/completions", body, {})
            ctx = _resolve(self.director.route(parsed))
        except EppError:
            return None
        self._contexts[index] = ctx
        return self._servers[ctx.target.name]

    def first_token(self, index: int) -> None:
        self.director.response_started(self._contexts[index])

    def finished(self, index: int, ok: bool, output_tokens: int) -> None:
        ctx = self._contexts.pop(index, None)
        if ctx is None:  # refused before it was routed
            return
        # The only failure a server reports here is a full waiting queue, which vLLM (and the simulator) answer 429.
        info = ResponseInfo(status=200, completion_tokens=output_tokens) if ok else ResponseInfo(status=429,
                                                                                             error=True)
        self.director.response_complete(ctx, info)

    def scrape(self, servers: Sequence[Server], now: float) -> None:
        """Replace every endpoint's Metrics with its engine's state, as one scrape of ``/metrics`` would."""
        for server in servers:
            endpoint = self.datastore.get(server.name)
            if endpoint is None:
                continue
            engine, cfg = server.engine, server.engine.cfg
            endpoint.metrics = Metrics(waiting=engine.num_waiting, running=engine.num_running,
                                       kv_usage=engine.kv_usage, block_size=cfg.block_size,
                                       num_gpu_blocks=cfg.num_gpu_blocks, max_num_seqs=cfg.max_num_seqs,
                                       update_time=now)


def _resolve(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine that completes without suspending. EPP's legacy admission never waits and the default
    pipeline has no request preparers, so ``Director.route`` finishes in one step; the simulation has no event
    loop to hand control to, and suspending would mean wall-clock time entered the model."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the request path suspended: a waiting admission or preparer needs an event loop")


def _pick(nodes: Sequence[str], score: Callable[[str], float], rng: random.Random) -> str:
    """The node with the highest score, ties broken at random (kube-scheduler's ``selectHost``)."""
    best = max(score(node) for node in nodes)
    return rng.choice([node for node in nodes if score(node) == best])


class LeastRequested:
    """kube-scheduler's default placement of identical pods: the feasible node with the fewest of them."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def place(self, pod: Mapping[str, Any], feasible: list[str], bound: Mapping[str, int]) -> str | None:
        return _pick(feasible, lambda node: -bound[node], self.rng)


class ExtenderPlacement:
    """The extender's filter, then its highest priority, over EPP's live endpoints."""

    def __init__(self, placer: NodePlacer, endpoints: Callable[[], Sequence[Endpoint]], seed: int) -> None:
        self.placer = placer
        self.endpoints = endpoints
        self.rng = random.Random(seed)
        self.decisions: list[tuple[list[tuple[str, int]], str]] = []  # (scores, chosen) per placement

    def place(self, pod: Mapping[str, Any], feasible: list[str], bound: Mapping[str, int]) -> str | None:
        endpoints = self.endpoints()
        passed, _failed = self.placer.filter(pod, feasible, endpoints)
        if not passed:
            return None
        if len(passed) == 1:
            self.decisions.append(([], passed[0]))
            return passed[0]
        scores = self.placer.prioritize(pod, passed, endpoints)
        by_node = dict(scores)
        chosen = _pick(passed, lambda node: by_node[node], self.rng)
        self.decisions.append((scores, chosen))
        return chosen
