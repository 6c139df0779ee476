"""Flow-control test kit: an injected clock, a settable saturation detector, request builders and a harness.

Nothing here sleeps on wall time: the clock only moves when a test advances it, and the dispatcher is driven by
calling ``dispatch()``/``expire()`` directly (the background loop is exercised separately).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any, Callable, ClassVar, Mapping, Sequence

from epp.flowcontrol import FlowControlConfig, FlowController, Grant, build_admission
from epp.framework.endpoint import Endpoint, EndpointSpec, Metrics
from epp.framework.request import ApiKind, InferenceRequest


class FakeClock:
    """Monotonic seconds that move only when told to."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeDetector:
    """Saturation is ``value``, or ``fn()`` when set (e.g. a function of in-flight requests)."""

    type_name: ClassVar[str] = "fake-detector"

    def __init__(self, value: float = 0.0, fn: Callable[[], float] | None = None) -> None:
        self.name = "fake-detector"
        self.value = value
        self.fn = fn
        self.seen: list[int] = []

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        self.seen.append(len(endpoints))
        return self.fn() if self.fn is not None else self.value


def make_request(fairness_id: str = "a", priority: int = 0, *, tokens: int = 20, size: int = 100,
                 request_id: str | None = None, objective: str | None = None,
                 headers: Mapping[str, str] | None = None) -> InferenceRequest:
    """A request whose ``estimated_total_tokens`` is ``tokens`` and ``body_size`` is ``size``."""
    return InferenceRequest(request_id=request_id or uuid.uuid4().hex, model="m",
                            api=ApiKind.COMPLETIONS, body={}, prompt_text="", input_tokens=tokens // 2,
                            max_tokens=tokens - tokens // 2, headers=dict(headers or {}), fairness_id=fairness_id,
                            objective=objective, priority=priority, body_size=size)


def endpoint(name: str, waiting: int = 0, kv: float = 0.0, update_time: float = 100.0, inflight: int = 0,
             inflight_tokens: int = 0) -> Endpoint:
    ep = Endpoint(EndpointSpec(name=name, address="10.0.0.1", port=8000),
                  Metrics(waiting=waiting, kv_usage=kv, update_time=update_time))
    ep.inflight_requests, ep.inflight_tokens = inflight, inflight_tokens
    return ep


def controller(config: dict[str, Any] | None = None, *, clock: FakeClock | None = None,
               detector: FakeDetector | None = None) -> FlowController:
    cfg = FlowControlConfig.model_validate(config or {})
    ctrl = build_admission(cfg, {"flowControl"}, detector or FakeDetector(), None, clock or FakeClock())
    assert isinstance(ctrl, FlowController)
    return ctrl


async def settle(turns: int = 3) -> None:
    """Let woken tasks run (no wall-clock wait)."""
    for _ in range(turns):
        await asyncio.sleep(0)


class Clients:
    """Spawns ``admit`` tasks and records what each got, in dispatch order."""

    def __init__(self, ctrl: FlowController) -> None:
        self.ctrl = ctrl
        self.pool: list[Endpoint] = [endpoint("e0")]
        """The candidate endpoints of every request sent (empty: the pool has scaled to zero)."""
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.order: list[str] = []
        self._ids = itertools.count()

    async def send(self, fairness_id: str = "a", priority: int = 0, **kw: Any) -> str:
        rid = kw.pop("request_id", None) or f"{fairness_id}#{next(self._ids)}"
        req = make_request(fairness_id, priority, request_id=rid, **kw)
        task = asyncio.create_task(self.ctrl.admit(req, lambda: list(self.pool)))
        task.add_done_callback(lambda t, rid=rid: self._done(rid, t))
        self.tasks[rid] = task
        await settle()
        return rid

    def _done(self, rid: str, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.order.append(rid)

    async def dispatch(self, limit: int | None = None) -> int:
        n = self.ctrl.dispatch(limit)
        await settle()
        return n

    def grant(self, rid: str) -> Grant:
        return self.tasks[rid].result()

    def error(self, rid: str) -> BaseException | None:
        task = self.tasks[rid]
        return task.exception() if task.done() and not task.cancelled() else None

    def tenants_of(self, rids: list[str]) -> str:
        return "".join(r.split("#")[0] for r in rids)
