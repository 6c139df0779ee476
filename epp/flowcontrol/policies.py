"""Flow-control policies: ordering (which request of a flow), fairness (which flow of a band), usage limits.

- An :class:`OrderingPolicy` gives each queued item a sort key; a flow serves its smallest key first (ties go to
  the earlier arrival). ``fcfs``: enqueue time. ``edf``: deadline (enqueue + TTL; no TTL sorts last), then
  enqueue time. ``slo-deadline``: SLO deadline (enqueue + the ``x-llm-d-router-slo-ttft-ms`` header, or its
  deprecated alias ``x-slo-ttft-ms``; none sorts last), then enqueue time.
- A :class:`FairnessPolicy` makes one :class:`FlowSelector` per band (the selector holds the band's cursor and
  deficits). ``select`` must not change state: the dispatcher may decline the choice (pool saturated) and ask
  again later; ``commit`` records that the chosen flow's head was dispatched.
  ``global-strict``: the flow whose head has the smallest key (one logical queue, no fairness).
  ``round-robin``: the next ready flow after the last one served.
  ``weighted-fair``: deficit round robin where each visit adds ``weight / min ready weight`` requests of credit.
- A :class:`UsageLimitPolicy` gives each priority the saturation at which its band stops dispatching.

Only *ready* flows are considered: non-empty and with a tenant whose quota admits its head request.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping, Protocol, Sequence, runtime_checkable

from epp.flowcontrol.base import Flow, OrderingPolicy, QueueItem
from epp.headers import SLO_TTFT_HEADER, header_value

__all__ = [
    "OrderingPolicy", "FairnessPolicy", "FlowSelector", "UsageLimitPolicy", "Choice", "FcfsOrdering",
    "EdfOrdering", "SloDeadlineOrdering", "SLO_TTFT_HEADER", "slo_ttft_ms", "GlobalStrictSelector",
    "RoundRobinSelector", "WeightedFairSelector", "StaticUsageLimit",
    "BUILTIN_ORDERING", "BUILTIN_FAIRNESS", "Ready",
]

Ready = Callable[[Flow], bool]


@dataclass(slots=True)
class Choice:
    """A selector's answer: the flow to serve, plus the state change ``commit`` applies."""

    flow: Flow
    credits: dict[int, float] = field(default_factory=dict)


@runtime_checkable
class FlowSelector(Protocol):
    def select(self, flows: Sequence[Flow], ready: Ready) -> Choice | None:
        """The flow to serve next among ``flows`` (creation order) for which ``ready`` holds; no side effects."""
        ...

    def commit(self, choice: Choice) -> None:
        """Record that ``choice.flow``'s head was dispatched."""
        ...


@runtime_checkable
class FairnessPolicy(Protocol):
    def new_selector(self) -> FlowSelector:
        """A fresh selector for one priority band."""
        ...


@runtime_checkable
class UsageLimitPolicy(Protocol):
    def usage_limit(self, priority: int) -> float:
        """The saturation at or above which the band of ``priority`` (and every band below it) stops dispatching."""
        ...


class FcfsOrdering:
    """First come, first served."""

    def key(self, item: QueueItem) -> tuple[float, ...]:
        return (item.enqueue_time,)


class EdfOrdering:
    """Earliest deadline first; requests without a TTL come after every request with one."""

    def key(self, item: QueueItem) -> tuple[float, ...]:
        return (item.deadline, item.enqueue_time)


_GO_SPACE = (" \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
             "\u2028\u2029\u202f\u205f\u3000")
"""What Go's ``strings.TrimSpace`` trims (``unicode.IsSpace``); Python's ``str.strip()`` also trims \\x1c-\\x1f."""
_DECIMAL = re.compile(r"[+-]?[0-9]+")
"""What Go's ``strconv.ParseInt(s, 10, 64)`` accepts: a sign, then ASCII digits (no underscores, no spaces)."""
_MAX_SLO_MS = (2**63 - 1) // 1_000_000
"""The largest SLO whose deadline offset fits Go's ``time.Duration`` (int64 nanoseconds, about 292 years)."""


def slo_ttft_ms(headers: Mapping[str, str]) -> int | None:
    """The request's ``x-llm-d-router-slo-ttft-ms`` (else its deprecated alias ``x-slo-ttft-ms``) in milliseconds,
    or None when it gives no deadline (as the reference's ``calculateSLODeadline``): the header missing or empty,
    not a base-10 integer once surrounding whitespace is trimmed (``"1.5"``, ``"1e3"``, ``"abc"``), or negative.
    ``headers`` are a request's, lower-case as both front ends deliver them (so the names match
    case-insensitively without a scan). Values beyond int64 nanoseconds (the reference fails to parse them, or its
    duration overflows) also give None."""
    value = header_value(headers, SLO_TTFT_HEADER)
    if not value:
        return None
    text = value.strip(_GO_SPACE)
    if _DECIMAL.fullmatch(text) is None:
        return None
    ms = int(text)
    return ms if 0 <= ms <= _MAX_SLO_MS else None


class SloDeadlineOrdering:
    """Earliest SLO deadline first: deadline = arrival + the TTFT SLO header (:func:`slo_ttft_ms`); a request
    without a valid header comes after every request with one; equal deadlines go to the earlier arrival.

    Arrival is the enqueue time, in whole nanoseconds so that equal deadlines compare equal (the reference works
    in ``time.Time``). The reference counts from its ``ReceivedTimestamp`` (request headers received); EPP queues a
    request as soon as its body is parsed, so the two differ by the body's upload and parse time.
    """

    def key(self, item: QueueItem) -> tuple[float, ...]:
        arrival = round(item.enqueue_time * 1e9)
        ttft_ms = slo_ttft_ms(item.request.headers)
        return (math.inf if ttft_ms is None else arrival + ttft_ms * 1_000_000, arrival)


def _after(flows: list[Flow], cursor: int) -> list[Flow]:
    """``flows`` rotated to start at the first one created after ``cursor`` (wrapping around)."""
    later = [f for f in flows if f.ordinal > cursor]
    return later + [f for f in flows if f.ordinal <= cursor]


class GlobalStrictSelector:
    """No fairness: the band behaves as one queue ordered by the ordering policy."""

    def select(self, flows: Sequence[Flow], ready: Ready) -> Choice | None:
        best: Flow | None = None
        best_key: tuple[tuple[float, ...], int] | None = None
        for flow in flows:
            if not ready(flow):
                continue
            entry = flow.queue.head_entry()
            assert entry is not None  # ready implies non-empty
            if best_key is None or (entry[0], entry[1]) < best_key:
                best, best_key = flow, (entry[0], entry[1])
        return Choice(best) if best is not None else None

    def commit(self, choice: Choice) -> None:
        return None


class RoundRobinSelector:
    """One request per ready flow in turn, in flow creation order."""

    def __init__(self) -> None:
        self._cursor = -1

    def select(self, flows: Sequence[Flow], ready: Ready) -> Choice | None:
        candidates = [f for f in flows if ready(f)]
        if not candidates:
            return None
        return Choice(_after(candidates, self._cursor)[0])

    def commit(self, choice: Choice) -> None:
        self._cursor = choice.flow.ordinal


class WeightedFairSelector:
    """Deficit round robin by tenant weight (cost: one request).

    The cursor stays on a flow while its credit covers a request; moving on to a flow adds
    ``weight / (smallest weight among ready flows)`` credit to it. A flow that empties loses its credit, and one the
    cursor leaves while its tenant is at quota keeps only the fraction. Over any stretch where flows stay
    backlogged and ready, dispatches follow their weights; a ready flow is served at least once per round (other
    flows get at most ``ceil(w_j / w_min) + 1`` each in between), so no ready flow starves.
    """

    def __init__(self) -> None:
        self._cursor = -1
        self._credit: dict[int, float] = {}

    def select(self, flows: Sequence[Flow], ready: Ready) -> Choice | None:
        self._forget_idle(flows)
        candidates = [f for f in flows if ready(f)]
        if not candidates:
            return None
        for flow in candidates:
            if flow.ordinal == self._cursor and self._credit.get(flow.ordinal, 0.0) >= 1.0:
                return Choice(flow)
        quantum = min(f.weight for f in candidates)
        credits: dict[int, float] = {}
        order = _after(candidates, self._cursor)
        while True:  # the lightest flow gains exactly 1 per visit, so the first pass always returns
            for flow in order:
                credit = credits.get(flow.ordinal, self._credit.get(flow.ordinal, 0.0)) + flow.weight / quantum
                credits[flow.ordinal] = credit
                if credit >= 1.0:
                    return Choice(flow, credits)

    def commit(self, choice: Choice) -> None:
        ordinal = choice.flow.ordinal
        left = self._credit.get(self._cursor)
        if ordinal != self._cursor and left is not None and left >= 1.0:
            # The cursor moves off a flow its tenant's quota blocked: like DRR, it keeps only the fraction, or
            # unused turns would pile up and later burst past the other flows (the starvation bound).
            self._credit[self._cursor] = left % 1.0
        self._credit.update(choice.credits)
        self._credit[ordinal] = self._credit.get(ordinal, 0.0) - 1.0
        self._cursor = ordinal

    def _forget_idle(self, flows: Sequence[Flow]) -> None:
        backlogged = {f.ordinal for f in flows if len(f)}
        for ordinal in [o for o in self._credit if o not in backlogged]:
            del self._credit[ordinal]


class StaticUsageLimit:
    """A fixed saturation ceiling (default 1.0), optionally different per priority."""

    def __init__(self, threshold: float = 1.0, per_priority: Mapping[int, float] | None = None) -> None:
        self.threshold = threshold
        self.per_priority = dict(per_priority or {})

    def usage_limit(self, priority: int) -> float:
        return self.per_priority.get(priority, self.threshold)


class _SelectorFactory:
    """A built-in fairness policy used when a ref names no configured plugin."""

    def __init__(self, selector: Callable[[], FlowSelector]) -> None:
        self._selector = selector

    def new_selector(self) -> FlowSelector:
        return self._selector()


BUILTIN_ORDERING: Mapping[str, OrderingPolicy] = MappingProxyType({
    "fcfs-ordering-policy": FcfsOrdering(), "fcfs": FcfsOrdering(),
    "edf-ordering-policy": EdfOrdering(), "edf": EdfOrdering(),
    "slo-deadline-ordering-policy": SloDeadlineOrdering(), "slo-deadline": SloDeadlineOrdering(),
})
"""Ordering policies by type name (and short name). A config's ref resolves here implicitly only for the default,
``fcfs-ordering-policy`` (others must be declared in ``plugins:``); programmatic use may name any (see ``.build``)."""

BUILTIN_FAIRNESS: Mapping[str, FairnessPolicy] = MappingProxyType({
    "global-strict-fairness-policy": _SelectorFactory(GlobalStrictSelector),
    "global-strict": _SelectorFactory(GlobalStrictSelector),
    "round-robin-fairness-policy": _SelectorFactory(RoundRobinSelector),
    "round-robin": _SelectorFactory(RoundRobinSelector),
    "weighted-fair-fairness-policy": _SelectorFactory(WeightedFairSelector),
    "weighted-fair": _SelectorFactory(WeightedFairSelector),
})
"""Fairness policies by type name (and short name). A config's ref resolves here implicitly only for the default,
``global-strict-fairness-policy`` (others must be declared in ``plugins:``); programmatic use may name any."""
