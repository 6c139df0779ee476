"""Per-program accounting and the scoring strategies of ``program-aware-fairness``
(:mod:`epp.plugins.flowcontrol.program_aware`).

A strategy sees one :class:`QueueInfo` per non-empty, ready flow of a band (creation order) and returns the flow to
dispatch from, or None. ``pick`` has no side effects (the dispatcher may decline the choice and ask again); state
changes come from the request hooks (``on_completed``) and the eviction sweep (``evict``). ``las`` scores least
attained service (decayed weighted tokens) against head wait; ``turn-priority`` scores the program's turn number
plus its head wait. Ties go to the flow created first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Sequence

from epp.framework.request import DEFAULT_FAIRNESS_ID

if TYPE_CHECKING:
    from epp.flowcontrol.queues import Flow

__all__ = ["ProgramMetrics", "QueueInfo", "Strategy", "LasStrategy", "TurnPriorityStrategy", "LAS", "TURN_PRIORITY",
           "STRATEGIES", "weighted_cost", "range_normalize"]

LAS = "las"
TURN_PRIORITY = "turn-priority"
STRATEGIES = (LAS, TURN_PRIORITY)
WEIGHT_INPUT_TOKEN = 1
WEIGHT_OUTPUT_TOKEN = 2
"""Output tokens cost about twice input tokens (the reference's weights)."""


def weighted_cost(prompt_tokens: int, completion_tokens: int) -> float:
    """Attained-service cost of one response."""
    return float(WEIGHT_INPUT_TOKEN * prompt_tokens + WEIGHT_OUTPUT_TOKEN * completion_tokens)


def range_normalize(value: float, low: float, high: float) -> float:
    """Min-max normalisation into [0, 1]; 0.5 when ``low == high`` (the signal does not discriminate)."""
    return 0.5 if high == low else (value - low) / (high - low)


@dataclass(slots=True)
class ProgramMetrics:
    """One program's lifecycle counts (the reference's ``ProgramMetrics``); times are the plugin's clock."""

    last_completion: float
    """Seeded with the creation time, so a program seen but never completing still becomes evictable."""
    dispatched: int = 0
    inflight: int = 0
    average_wait_ms: float = 0.0
    wait_count: int = 0
    completed: bool = False

    def record_dispatched(self, wait_ms: float | None) -> None:
        """A request of this program passed PreRequest; ``wait_ms`` is its queue wait (None: not observed)."""
        self.inflight += 1
        self.dispatched += 1
        if wait_ms is None:
            return
        self.wait_count += 1
        self.average_wait_ms += (wait_ms - self.average_wait_ms) / self.wait_count  # cumulative running mean

    def record_completion(self, now: float) -> None:
        """A request of this program ended."""
        self.inflight = max(0, self.inflight - 1)
        self.last_completion = now
        self.completed = True


@dataclass(slots=True)
class QueueInfo:
    """What a strategy reads of one candidate flow: its program, metrics (None: never dispatched) and head."""

    flow: Flow
    program_id: str
    metrics: ProgramMetrics | None
    head_enqueue: float


class Strategy(Protocol):
    name: str

    def pick(self, queues: Sequence[QueueInfo], now: float) -> Flow | None:
        """The flow to dispatch from among ``queues`` (non-empty, in creation order); no side effects."""
        ...

    def on_completed(self, program_id: str, cost: float, now: float) -> None:
        """A response of ``program_id`` ended having cost ``cost`` weighted tokens."""
        ...

    def evict(self, program_id: str) -> None:
        """Drop the strategy's state of an evicted program."""
        ...

    def gauge_values(self) -> dict[str, float] | None:
        """``program_aware_attained_service_tokens`` by program, or None when the strategy owns no such gauge."""
        ...


@dataclass(slots=True)
class _LasState:
    service: float = 0.0
    anchor: float | None = None
    """The instant up to which decay is folded into ``service`` (None: never accumulated)."""
    reported: float = 0.0
    """The gauge's value: the service right after the last completion (decay is not folded into it later)."""

    def decayed(self, now: float, half_life: float) -> float:
        """``service`` with the decay accrued since ``anchor`` applied (pure)."""
        if self.anchor is None or half_life <= 0 or now <= self.anchor:
            return self.service
        return self.service * math.exp2(-(now - self.anchor) / half_life)


class LasStrategy:
    """Least attained service: the program that has consumed the fewest (decayed) weighted tokens goes first."""

    name = LAS

    def __init__(self, weight_service: float, weight_head_wait: float, half_life_seconds: float) -> None:
        self.weight_service = weight_service
        self.weight_head_wait = weight_head_wait
        self.half_life_seconds = half_life_seconds
        self._state: dict[str, _LasState] = {}

    def service(self, program_id: str, now: float) -> float:
        """The program's attained service at ``now``, decay applied."""
        state = self._state.get(program_id)
        return 0.0 if state is None else state.decayed(now, self.half_life_seconds)

    def pick(self, queues: Sequence[QueueInfo], now: float) -> Flow | None:
        if not queues:
            return None
        services = [self.service(q.program_id, now) for q in queues]
        waits = [float(math.floor(max(0.0, now - q.head_enqueue) * 1000.0)) for q in queues]  # Go: Milliseconds()
        lo_s, hi_s, lo_w, hi_w = min(services), max(services), min(waits), max(waits)
        best, best_score = None, -math.inf
        for queue, service, wait in zip(queues, services, waits):
            score = (self.weight_service * (1.0 - range_normalize(service, lo_s, hi_s))
                     + self.weight_head_wait * range_normalize(wait, lo_w, hi_w))
            if score > best_score:
                best, best_score = queue.flow, score
        return best

    def on_completed(self, program_id: str, cost: float, now: float) -> None:
        state = self._state.setdefault(program_id, _LasState())
        state.service = state.decayed(now, self.half_life_seconds) + cost
        state.anchor = now
        state.reported = state.service

    def evict(self, program_id: str) -> None:
        self._state.pop(program_id, None)

    def gauge_values(self) -> dict[str, float] | None:
        return {pid: state.reported for pid, state in self._state.items()}


@dataclass(slots=True)
class TurnPriorityStrategy:
    """Deepest session first, aged by head wait so shallower sessions are not starved within the request TTL."""

    time_weight: float
    inactivity_seconds: float
    name: str = field(default=TURN_PRIORITY, init=False)

    def turn_number(self, queue: QueueInfo) -> int:
        """The head request's turn: dispatched count + 1, reset to 1 after inactivity and for ``default-flow``."""
        metrics = queue.metrics
        if metrics is None or queue.program_id == DEFAULT_FAIRNESS_ID:
            return 1
        if self.inactivity_seconds > 0 and metrics.inflight == 0 and metrics.completed:
            if queue.head_enqueue - metrics.last_completion > self.inactivity_seconds:
                return 1
        return metrics.dispatched + 1

    def pick(self, queues: Sequence[QueueInfo], now: float) -> Flow | None:
        best, best_score, best_wait = None, -math.inf, -math.inf
        for queue in queues:
            wait = max(0.0, now - queue.head_enqueue)
            score = self.turn_number(queue) + self.time_weight * wait
            if score > best_score or (score == best_score and wait > best_wait):
                best, best_score, best_wait = queue.flow, score, wait
        return best

    def on_completed(self, program_id: str, cost: float, now: float) -> None:
        return None

    def evict(self, program_id: str) -> None:
        return None

    def gauge_values(self) -> dict[str, float] | None:
        return None
