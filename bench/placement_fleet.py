"""The simulated fleet of ``bench.placement``: nodes with GPU slots, model servers on them, and one event loop in
simulated time that feeds them requests, steps their engines and keeps the score.

Node-sharing model, the one thing that makes placement matter (every regime runs under it alike)::

    step duration = engine's own duration (its TimeModel) × (1 + slowdown if the node is slow) × (1 + contention · b)

``b`` is the number of *other* servers on the same node that are mid-step when this step starts: co-located servers
share the node's host CPU, PCIe and memory bandwidth, so a busy neighbour slows them. A slow node stands for a
throttled or older machine offering the same ``nvidia.com/gpu`` resource, which no resource request tells apart.
A node hosts at most ``gpus`` servers (one GPU each).

Who routes and who places is not decided here: a :class:`Router` picks the server of each request (and may refresh
a view of the servers every ``scrape_interval``), a :class:`Placer` picks the node of each new replica at the
scale-up. Nothing reads a wall clock; a run is deterministic for its inputs.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from epp_sim import Engine, QueueFull, SimConfig, TimeModel

__all__ = ["FleetSpec", "Request", "Server", "Router", "Placer", "Fleet", "Outcome", "model_server_pod",
           "POOL_LABELS"]

POOL_LABELS = {"app": "sim-model-server"}
"""The labels of every model-server pod (and so of every endpoint): the pool's selector."""
RETRY_S = 1.0
"""How long an unplaced pod waits before kube-scheduler tries it again (its initial pod back-off)."""


@dataclass(frozen=True)
class Request:
    """One request of the workload: when it arrives, its prompt length and how many tokens it generates."""

    arrival: float
    prompt_len: int
    max_tokens: int


@dataclass(frozen=True)
class FleetSpec:
    """The fleet, the node-sharing model and the scale-up; the same for every regime of a table."""

    nodes: int = 4
    gpus: int = 4
    servers: int = 8
    add: int = 4
    scale_at: float = 60.0
    slow_nodes: int = 1
    slowdown: float = 0.5
    contention: float = 0.1
    batch: int = 64
    max_wait: float = 0.25
    duration: float = 120.0
    drain: float = 120.0
    time_model: TimeModel = TimeModel()  # the simulator's default: Llama-3-8B on one H100

    def node_names(self) -> list[str]:
        return [f"node-{i}" for i in range(self.nodes)]

    def is_slow(self, node: str) -> bool:
        """The first ``slow_nodes`` nodes are the slow ones."""
        return int(node.rsplit("-", 1)[1]) < self.slow_nodes


def model_server_pod(name: str) -> dict[str, Any]:
    """The v1 Pod a new replica is, as kube-scheduler hands it to an extender (the fields the policy reads)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": dict(POOL_LABELS)},
            "spec": {"containers": [{"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


class Server:
    """One model server: its engine, its node, when it joined, and what it did inside the measured window."""

    def __init__(self, name: str, node: str, index: int, joined: float, cfg: SimConfig) -> None:
        self.name = name
        self.node = node
        self.index = index
        self.joined = joined
        self.engine = Engine(cfg)
        self.stepping = False
        self.step_end = 0.0
        self.busy_s = 0.0  # seconds inside the window with a step in progress
        self.slot_s = 0.0  # Σ sequences in the batch × seconds, inside the window


class Router(Protocol):
    """Sends each request to a server. ``first_token``/``finished`` report back what became of it."""

    scrape_interval: float | None

    def add_server(self, server: Server) -> None: ...
    def route(self, index: int, request: Request, now: float) -> Server | None: ...
    def first_token(self, index: int) -> None: ...
    def finished(self, index: int, ok: bool, output_tokens: int) -> None: ...
    def scrape(self, servers: Sequence[Server], now: float) -> None: ...


class Placer(Protocol):
    """Chooses the node of a new replica among ``feasible`` (nodes with a free GPU), or None (stays Pending).
    ``bound`` counts the pool's pods bound to each node, pending ones being placed included."""

    def place(self, pod: Mapping[str, Any], feasible: list[str], bound: Mapping[str, int]) -> str | None: ...


@dataclass
class Outcome:
    """What one regime did. Window = [0, duration); times in seconds."""

    duration: float
    output_tokens: int = 0  # generated inside the window
    completed_in_window: int = 0
    ttfts: list[float] = field(default_factory=list)  # one per request; math.inf if it never got a token
    completed: int = 0
    failed: int = 0
    slot_util: float = 0.0
    busy_share: float = 0.0
    per_node: dict[str, int] = field(default_factory=dict)
    placed_at: list[float] = field(default_factory=list)
    decisions: list[tuple[list[tuple[str, int]], str]] = field(default_factory=list)  # the extender's, if any


_ARRIVE, _STEP, _WAKE, _SCRAPE, _SCALE = range(5)


class Fleet:
    """The discrete-event simulation of one regime: arrivals, engine steps, scrapes and the scale-up."""

    def __init__(self, spec: FleetSpec, batching: str, router: Router, placer: Placer,
                 requests: Sequence[Request], clock: Callable[[float], None] | None = None) -> None:
        self.spec = spec
        self.router = router
        self.placer = placer
        self.requests = requests
        self.set_clock = clock or (lambda now: None)
        self.cfg = SimConfig(batching=batching, max_num_seqs=spec.batch, max_wait_time_s=spec.max_wait,
                             time_model=spec.time_model)
        self.servers: list[Server] = []
        self.by_node: dict[str, list[Server]] = {node: [] for node in spec.node_names()}
        self.outcome = Outcome(spec.duration, ttfts=[math.inf] * len(requests))
        self._events: list[tuple[float, int, int, Any]] = []
        self._order = 0
        self._open = len(requests)  # requests not yet finished or failed
        self._pending = [f"replica-{spec.servers + k}" for k in range(spec.add)]

    # --------------------------------------------------------------------------------------------- set-up

    def start_server(self, node: str, now: float) -> Server:
        """A new server on ``node`` (seeded by its index, so every regime gets the same engines)."""
        index = len(self.servers)
        cfg = self.cfg.model_copy(update={"seed": index})
        server = Server(f"sim-{index}", node, index, now, cfg)
        self.servers.append(server)
        self.by_node[node].append(server)
        self.router.add_server(server)
        return server

    def bound(self) -> dict[str, int]:
        return {node: len(servers) for node, servers in self.by_node.items()}

    def step_factor(self, server: Server, now: float) -> float:
        """The node-sharing multiplier of a step ``server`` starts at ``now`` (module docstring)."""
        busy = sum(1 for s in self.by_node[server.node] if s is not server and s.stepping and s.step_end > now)
        slow = 1.0 + self.spec.slowdown if self.spec.is_slow(server.node) else 1.0
        return slow * (1.0 + self.spec.contention * busy)

    # ------------------------------------------------------------------------------------------------ run

    def run(self) -> Outcome:
        """Place the initial servers one per node in turn (kube-scheduler's spreading for identical pods), run
        until every request is done or ``duration + drain`` passes, and return the outcome."""
        spec = self.spec
        nodes = spec.node_names()
        for i in range(spec.servers):
            self.start_server(nodes[i % len(nodes)], 0.0)
        for i, request in enumerate(self.requests):
            self._push(request.arrival, _ARRIVE, i)
        if spec.add:
            self._push(spec.scale_at, _SCALE, None)
        if self.router.scrape_interval:
            self._push(self.router.scrape_interval, _SCRAPE, None)
        end = spec.duration + spec.drain
        while self._events and self._open:
            now, _, kind, payload = heapq.heappop(self._events)
            if now > end:
                break
            self.set_clock(now)
            self._dispatch(kind, payload, now)
        return self._finish()

    def _push(self, at: float, kind: int, payload: Any) -> None:
        self._order += 1
        heapq.heappush(self._events, (at, self._order, kind, payload))

    def _dispatch(self, kind: int, payload: Any, now: float) -> None:
        if kind == _ARRIVE:
            self._arrive(payload, now)
        elif kind == _STEP:
            payload.stepping = False
            self._kick(payload, now)
        elif kind == _WAKE:
            self._kick(payload, now)
        elif kind == _SCRAPE:
            self.router.scrape(self.servers, now)
            assert self.router.scrape_interval
            self._push(now + self.router.scrape_interval, _SCRAPE, None)
        else:
            self._scale(now)

    def _arrive(self, index: int, now: float) -> None:
        request = self.requests[index]
        server = self.router.route(index, request, now)
        if server is None:
            self._fail(index)
            return
        # A distinct token per request keeps prefix caching out of the comparison; the content is irrelevant to
        # the time model.
        prompt = array("I", [index + 1]) * request.prompt_len
        try:
            server.engine.add(str(index), prompt, now, max_tokens=request.max_tokens)
        except QueueFull:
            self._fail(index)
            return
        self._kick(server, now)

    def _fail(self, index: int) -> None:
        self.outcome.failed += 1
        self._open -= 1
        self.router.finished(index, False, 0)

    def _kick(self, server: Server, now: float) -> None:
        """Complete ``server``'s batch that ends at ``now`` (if any) and start its next step."""
        if server.stepping:
            return
        engine = server.engine
        duration = engine.step(now)
        self._collect(engine, now)
        if duration is None:
            wake = engine.next_wakeup(now)
            if wake is not None:
                self._push(wake, _WAKE, server)
            return
        length = duration * self.step_factor(server, now)
        server.stepping, server.step_end = True, now + length
        inside = max(0.0, min(now + length, self.spec.duration) - now)
        server.busy_s += inside
        server.slot_s += inside * len(engine.scheduled)
        self._push(now + length, _STEP, server)

    def _collect(self, engine: Engine, now: float) -> None:
        out = self.outcome
        in_window = now <= self.spec.duration
        if in_window:
            out.output_tokens += len(engine.emitted)
        for seq in engine.emitted:
            if seq.num_output == 1:
                index = int(seq.req_id)
                out.ttfts[index] = now - seq.arrival
                self.router.first_token(index)
        for seq in engine.finished:
            out.completed += 1
            out.completed_in_window += in_window
            self._open -= 1
            self.router.finished(int(seq.req_id), True, seq.num_output)

    def _scale(self, now: float) -> None:
        """Place every pending replica, then start them. kube-scheduler takes the pods of a scale-up one after the
        other within milliseconds: each sees the pods bound before it (its cache assumes them), but none of them is
        an endpoint yet (a pod joins the pool when it is Ready), so the extender sees the pool as it was. Pods that
        find no node are tried again after :data:`RETRY_S`."""
        still, placed = [], []
        bound = self.bound()
        for name in self._pending:
            feasible = [node for node, n in bound.items() if n < self.spec.gpus]  # NodeResourcesFit: a free GPU
            node = self.placer.place(model_server_pod(name), feasible, dict(bound)) if feasible else None
            if node is None:
                still.append(name)
                continue
            bound[node] += 1
            placed.append(node)
        for node in placed:
            self.start_server(node, now)
            self.outcome.placed_at.append(now)
        self._pending = still
        if still:
            self._push(now + RETRY_S, _SCALE, None)

    def _finish(self) -> Outcome:
        out, spec = self.outcome, self.spec
        out.failed += self._open  # still queued or running when the drain ran out
        slots = busy = 0.0
        for server in self.servers:
            present = max(0.0, spec.duration - server.joined)
            slots += present * spec.batch
            busy += present
        out.slot_util = sum(s.slot_s for s in self.servers) / slots if slots else 0.0
        out.busy_share = sum(s.busy_s for s in self.servers) / busy if busy else 0.0
        out.per_node = self.bound()
        return out
