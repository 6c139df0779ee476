"""One simulated vLLM server's engine side: the engine, the task driving it, and what its HTTP handlers call.

The driver task calls `engine.step(now)`, wakes the handlers whose requests produced
tokens, publishes KV events, and sleeps the step's modelled duration times
`time_scale`. Simulated time advances by exactly the modelled duration of each busy
step; the wall-clock schedule keeps an absolute deadline so that coarse timer
resolution at small time scales does not slow the simulation down on average. When the
engine is idle the task waits on an asyncio.Event that new requests set.
:class:`~.server.SimServer` adds the HTTP listener; the handlers (:mod:`.api`) see only this class.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import uuid
from typing import Any

import aiohttp

from .config import SimConfig
from .engine import Engine, Seq
from .kvevents import KVEventPublisher
from .metrics import MetricsRenderer
from .served import Served
from .tokenizer import OutputText, load_tokenizer

__all__ = ["SimBackend"]

log = logging.getLogger(__name__)

# Servers of this process by engine id, so a decoder can tell its prefiller directly
# that the KV blocks were pulled (NIXL's notification) without an HTTP round trip.
_REGISTRY: dict[str, SimBackend] = {}
_MAX_LAG_S = 0.05  # wall-clock lag after which the driver stops trying to catch up


class SimBackend:
    """A simulated vLLM engine and its driver, as the HTTP handlers use them (:meth:`start_driver` once the server
    listens at host:port)."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.tokenizer = load_tokenizer(cfg.tokenizer)
        self.output = OutputText(self.tokenizer, cfg.seed)
        self.engine = Engine(
            cfg, output=self.output, record_events=cfg.kv_events_endpoint is not None
        )
        self.metrics = MetricsRenderer(cfg)
        self.loras: dict[str, str] = {name: name for name in cfg.lora_adapters}
        self.host = "127.0.0.1"
        self.port = 0
        self.engine_id = cfg.engine_id or ""
        self.kv_publisher: KVEventPublisher | None = None
        self.pull_sources: dict[str, dict[str, Any]] = {}
        self._handshakes: set[tuple[str, str, str]] = set()  # prefillers in other processes reached
        self._failure_rate = cfg.failure_rate
        self._fault: str = cfg.fault
        self.inference_requests = 0  # inference requests that got past validation (what a fault hits), probes included
        self.served = Served()  # the prompts of the (chat) completions accepted, for GET /sim/served
        self._fault_status = cfg.failure_status
        self._unwedged = asyncio.Event()  # set unless the fault is "hang"
        if self._fault != "hang":
            self._unwedged.set()
        self._rng = random.Random(cfg.seed + 1)
        self._ids = itertools.count()
        self._driver: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._unhung = asyncio.Event()
        self._unhung.set()
        self._session: aiohttp.ClientSession | None = None
        self._background: set[asyncio.Task[Any]] = set()
        # Clock: simulated time of the step in flight, and the wall time it started at.
        self._sim_now = 0.0
        self._step_end = 0.0
        self._wall_start = 0.0
        self._busy = False
        self._stopping = False

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start_driver(self, host: str, port: int) -> None:
        """The server listens at host:port: start the engine driver (and the KV-event publisher, if configured)."""
        self.host = host
        self.port = port
        if not self.engine_id:
            self.engine_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.url}/{self.cfg.model}"))
        _REGISTRY[self.engine_id] = self
        if self.cfg.kv_events_endpoint:
            topic = self.cfg.kv_events_topic or f"kv@{self.address}@{self.cfg.model}"
            self.kv_publisher = KVEventPublisher(
                self.cfg.kv_events_endpoint,
                topic,
                block_size=self.cfg.block_size,
                fmt=self.cfg.kv_events_format,
                bind=self.cfg.kv_events_bind,
            )
        loop = asyncio.get_running_loop()
        self._wall_start = loop.time()
        self._stopping = False
        self._driver = loop.create_task(self._drive(), name=f"sim-driver-{self.port}")

    async def stop_driver(self) -> None:
        """Stop the engine driver (the first step of stopping the server)."""
        _REGISTRY.pop(self.engine_id, None)
        self._unhung.set()
        self._unwedged.set()
        if self._driver is not None:
            # Python 3.11's wait_for drops a cancellation that arrives as the wake-up event fires;
            # the flag ends the driver's loop then.
            self._stopping = True
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
            self._driver = None

    async def release(self) -> None:
        """Release what is left once the listener is down: background tasks, the HTTP client, the publisher."""
        for task in list(self._background):
            task.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.kv_publisher is not None:
            self.kv_publisher.close()
            self.kv_publisher = None

    # ---------------------------------------------------------- failure injection

    def set_hung(self, hung: bool) -> None:
        """While hung, the server accepts connections but answers nothing."""
        if hung:
            self._unhung.clear()
        else:
            self._unhung.set()

    @property
    def hung(self) -> bool:
        return not self._unhung.is_set()

    async def wait_unhung(self) -> None:
        await self._unhung.wait()

    def set_failure_rate(self, rate: float) -> None:
        """Fraction of inference requests answered at once with `cfg.failure_status`."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError("failure rate must be within [0, 1]")
        self._failure_rate = rate

    def should_fail(self) -> bool:
        return self._fault == "fail" or (self._failure_rate > 0 and self._rng.random() < self._failure_rate)

    @property
    def failure_status(self) -> int:
        """The status of injected failures (a failure-rate draw or the "fail" fault)."""
        return self._fault_status

    def set_fault(self, mode: str, status: int | None = None) -> None:
        """Wedge the server (``fail``: every inference request gets ``status``, default the config's
        ``failure_status``; ``hang``: inference requests wait, unanswered, until the fault changes) or recover it
        (``ok``: requests held by ``hang`` go on). ``/metrics``, ``/health`` and ``/v1/models`` answer throughout,
        as a wedged engine behind a live API process does."""
        if mode not in ("ok", "fail", "hang"):
            raise ValueError("fault mode must be ok, fail or hang")
        if status is not None and not 400 <= status <= 599:
            raise ValueError("fault status must be within [400, 599]")
        self._fault = mode
        self._fault_status = status if status is not None else self.cfg.failure_status
        if mode == "hang":
            self._unwedged.clear()
        else:
            self._unwedged.set()

    @property
    def fault(self) -> str:
        """``ok``, ``fail`` or ``hang`` (:meth:`set_fault`)."""
        return self._fault

    async def wait_unwedged(self) -> None:
        """Until the fault is no longer ``hang`` (at once when it is not)."""
        while not self._unwedged.is_set():
            await self._unwedged.wait()

    # -------------------------------------------------------------------- clock

    def sim_time(self) -> float:
        """Current simulated time, for stamping arrivals."""
        loop = asyncio.get_running_loop()
        t = self._sim_now + (loop.time() - self._wall_start) / self.cfg.time_scale
        return min(t, self._step_end) if self._busy else t

    # ------------------------------------------------------------------ requests

    def next_request_id(self, client_id: str | None) -> str:
        n = next(self._ids)
        return f"{client_id}-{n}" if client_id else f"req-{n}"

    def submit(self, req_id: str, prompt_ids: Any, **kw: Any) -> Seq:
        """Queue a request in the engine and wake the driver (QueueFull/RequestTooLong pass)."""
        seq = self.engine.add(req_id, prompt_ids, self.sim_time(), **kw)
        self._wake.set()
        return seq

    async def wait(self, seq: Seq) -> None:
        """Until `seq` has finished (non-streaming requests); aborts it on cancel."""
        fut = asyncio.get_running_loop().create_future()
        seq.waiter = fut
        try:
            await fut
        except asyncio.CancelledError:
            self.abort(seq)
            raise

    async def kv_pull_ok(self, params: dict[str, Any]) -> bool:
        """Whether a decode request can pull its KV from the prefiller its ``kv_transfer_params`` name.

        If not, vLLM's NIXL connector recomputes the prompt locally (the request still succeeds); the
        failure is counted in ``engine.stats.kv_load_failures`` and logged.
        """
        if await self._handshake(params):
            return True
        self.engine.stats.kv_load_failures += 1
        log.warning(
            "%s: cannot pull KV from engine %r at %s:%s; recomputing the prompt", self.url,
            params.get("remote_engine_id"), params.get("remote_host"), params.get("remote_port"),
        )
        return False

    async def _handshake(self, params: dict[str, Any]) -> bool:
        """NIXL's handshake: the prefiller must exist under ``remote_engine_id``. One of this process is
        found by engine id; another is asked for its engine id at remote_host:remote_port (its HTTP
        address), once, as NIXL keeps its handshakes."""
        engine_id = params.get("remote_engine_id")
        if not engine_id:
            return False
        engine_id = str(engine_id)
        if engine_id in _REGISTRY:
            return True
        host, port = params.get("remote_host"), params.get("remote_port")
        if not host or not port:
            return False
        peer = (engine_id, str(host), str(port))
        if peer in self._handshakes:
            return True
        try:
            async with self._client().get(f"http://{host}:{port}/sim/info") as resp:
                info = await resp.json() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        if not isinstance(info, dict) or info.get("engine_id") != engine_id:
            return False
        self._handshakes.add(peer)
        return True

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        return self._session

    def abort(self, seq: Seq) -> None:
        """Cancel ``seq`` (its client went away). A decode request that has not pulled its KV yet still tells
        its prefiller to free the blocks, as vLLM's NixlConnector does for a request finished before its pull."""
        self.engine.abort(seq, self.sim_time())
        self._notify_prefiller(seq)
        self._wake.set()

    def release_kv(self, req_id: str) -> bool:
        ok = self.engine.release_kv(req_id)
        self._wake.set()
        return ok

    def reset_prefix_cache(self) -> bool:
        ok = self.engine.reset_prefix_cache()
        self._publish_events()
        return ok

    # ------------------------------------------------------------------- driver

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        engine, scale = self.engine, self.cfg.time_scale
        deadline = loop.time()
        while not self._stopping:
            now = self._sim_now
            try:
                duration = engine.step(now)
                self._dispatch()
            except Exception:
                # Without its driver a server hangs every request; make the cause visible.
                log.exception("simulator driver of %s crashed", self.url)
                raise
            if duration is None:
                self._busy = False
                self._wall_start = loop.time()
                self._wake.clear()
                wakeup = engine.next_wakeup(now)
                timeout = None if wakeup is None else (wakeup - now) * scale
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout)
                    timed_out = False
                except TimeoutError:
                    timed_out = True
                self._sim_now = max(now, self.sim_time())
                if timed_out and wakeup is not None:
                    self._sim_now = max(self._sim_now, wakeup)
                deadline = loop.time()
                continue
            self._busy = True
            self._step_end = now + duration
            deadline += duration * scale
            wall = loop.time()
            if wall - deadline > _MAX_LAG_S:
                deadline = wall  # cannot keep up; let simulated time run slower than asked
            self._wall_start = wall
            await asyncio.sleep(max(0.0, deadline - wall))
            self._sim_now = now + duration

    def _dispatch(self) -> None:
        engine = self.engine
        for seq in engine.emitted:
            if seq.stream and seq.waiter is not None:
                seq.waiter(seq)  # a TokenSink: writes the new tokens to the socket
        for seq in engine.finished:
            waiter = seq.waiter
            if waiter is not None:
                seq.waiter = None
                if seq.stream:
                    waiter(seq)
                elif not waiter.done():  # cancelled if the client has just gone away
                    waiter.set_result(None)
        for seq in engine.pulled:
            self._notify_prefiller(seq)
        self._publish_events()

    def _publish_events(self) -> None:
        events = self.engine.bm.events
        if events:
            if self.kv_publisher is not None:
                self.kv_publisher.publish(events, self.engine.lora_ids)
            events.clear()

    def _notify_prefiller(self, seq: Seq) -> None:
        params = self.pull_sources.pop(seq.req_id, None)
        if not params or not params.get("remote_request_id"):
            return
        peer = _REGISTRY.get(str(params.get("remote_engine_id")))
        if peer is not None:
            peer.release_kv(params["remote_request_id"])
        elif params.get("remote_host") and params.get("remote_port"):
            task = asyncio.get_running_loop().create_task(self._release_remote(params))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _release_remote(self, params: dict[str, Any]) -> None:
        url = f"http://{params['remote_host']}:{params['remote_port']}/sim/kv_release"
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self._client().post(url, json={"request_id": params["remote_request_id"]}):
                pass
