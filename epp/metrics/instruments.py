"""Counters, gauges and histograms for the request path: plain numbers, exported through prometheus-client.

prometheus-client's own instruments take a lock and run checks on every operation; EPP records from its event-loop
thread only, so these keep plain Python numbers and :class:`Family` exposes them to a
``prometheus_client.CollectorRegistry`` as an ordinary collector (names, labels, buckets and expositions are
prometheus-client's; no ``_created`` series). A metric exported under two names (:func:`renamed`) is one family and
its :meth:`~Family.twin`, sharing their series. Contract: record from one thread (the event loop); collection may
run in another, reading a snapshot, so a concurrent observation is counted in this scrape or the next.
"""

from __future__ import annotations

from abc import abstractmethod
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Generic, Self, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["Child", "CounterChild", "CounterFamily", "Family", "GaugeChild", "GaugeFamily", "HistogramChild",
           "HistogramFamily", "HistogramTee", "LabelCap", "Reported", "counter", "gauge", "histogram", "renamed",
           "DEFAULT_FAIRNESS_ID_LIMIT", "DEFAULT_MODEL_NAME_LIMIT"]

DEFAULT_FAIRNESS_ID_LIMIT = 1000
"""Distinct ``fairness_id`` label values recorded before new ones fold into ``other`` (the reference's default)."""
DEFAULT_MODEL_NAME_LIMIT = 10
"""Distinct model names the pool is not known to serve that the model labels record before new ones fold into
``other`` (``--model-name-metric-label-limit``; why 10: docs/datalayer.md, "Bounded label values")."""


class CounterChild:
    """One counter series."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        """Add ``amount`` (must not be negative)."""
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class GaugeChild:
    """One gauge series: a value set by the recorder, or read from a function at each collection."""

    __slots__ = ("value", "function")

    def __init__(self) -> None:
        self.value = 0.0
        self.function: Callable[[], float] | None = None

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)

    def set_function(self, function: Callable[[], float]) -> None:
        """Report ``function()`` at every collection instead of the recorded value (as prometheus-client's
        ``Gauge.set_function``); it runs in the collecting thread and must not block."""
        self.function = function

    def get(self) -> float:
        """The value a collection reports now."""
        return self.value if self.function is None else float(self.function())


class HistogramChild:
    """One histogram series: per-bucket counts (the last one is ``+Inf``) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bucket whose upper bound is >= it."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class HistogramTee:
    """Two histogram series with the same buckets observed as one, for a value recorded under two families whose
    labels differ (a twin cannot share the series then): one call and one bucket search instead of two."""

    __slots__ = ("first", "second", "bounds")

    def __init__(self, first: HistogramChild, second: HistogramChild) -> None:
        if first.bounds != second.bounds:
            raise ValueError("a histogram tee needs two series with the same buckets")
        self.first, self.second, self.bounds = first, second, first.bounds

    def observe(self, value: float) -> None:
        """Count ``value`` in both series."""
        i = bisect_left(self.bounds, value)
        first, second = self.first, self.second
        first.counts[i] += 1
        first.sum += value
        second.counts[i] += 1
        second.sum += value


Child = CounterChild | GaugeChild | HistogramChild
ChildT = TypeVar("ChildT", bound=Child)

Reported = float | tuple[list[int], float]
"""A series' value as collections report it and ``--workers`` peers exchange it: a number, or a histogram's
(bucket counts, sum)."""


class Family(Collector, Generic[ChildT]):
    """A metric family whose series are ``ChildT`` children, by label values, registered on ``registry`` at
    construction: :class:`CounterFamily`, :class:`GaugeFamily` or :class:`HistogramFamily`.

    ``twin_of``: export ``twin_of``'s series under this name (and these label names, as many), instead of series
    of its own: see :meth:`twin`.
    """

    kind: ClassVar[str]
    """``counter``, ``gauge`` or ``histogram``: the Prometheus type it is exported as."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: CollectorRegistry, buckets: Sequence[float] = (), twin_of: Self | None = None) -> None:
        kind = self.kind
        self.name = name[:-6] if kind == "counter" and name.endswith("_total") else name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        bounds = tuple(float(b) for b in buckets if b != float("inf"))
        if kind == "histogram" and (not bounds or list(bounds) != sorted(set(bounds))):
            raise ValueError(f"{name}: histogram buckets must be given in increasing order")
        self.bounds = bounds
        self.twin_of = twin_of
        self._children: dict[tuple[str, ...], ChildT] = {} if twin_of is None else twin_of._children
        self._peers: dict[int, dict[tuple[str, ...], Reported]] = {} if twin_of is None else twin_of._peers
        registry.register(self)

    def twin(self, name: str, documentation: str, labelnames: Sequence[str] | None = None, *,
             registry: CollectorRegistry) -> Self:
        """A family of the same kind and buckets exporting this family's series under ``name`` (with
        ``labelnames``, default this family's; as many, in the same order), registered on ``registry``.

        The two share their children and their peers' values: whatever is recorded through either (a child from
        :meth:`labels` of either) shows in both, at no cost per recording, which is how a metric is exported
        under a deprecated name and its replacement at once. A twin's :meth:`snapshot` repeats its source's, so
        a worker sends the source's only (``twin_of`` tells them apart)."""
        labels = self.labelnames if labelnames is None else tuple(labelnames)
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{name}: a twin of {self.name} needs {len(self.labelnames)} label names")
        return type(self)(name, documentation, labels, registry=registry, buckets=self.bounds, twin_of=self)

    def labels(self, *values: str) -> ChildT:
        """The child for ``values`` (created on first use)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected {len(self.labelnames)} label values, got {len(values)}")
            child = self._children[values] = self._new_child()
        return child

    @abstractmethod
    def _new_child(self) -> ChildT:
        """A new series of this kind."""

    # -- other processes' values (``epp serve --workers N``) ---------------------------------------------------

    def snapshot(self) -> list[tuple[tuple[str, ...], Reported]]:
        """This process's recorded values by label values: a number, or (bucket counts, sum) for a histogram.
        Function gauges are left out (they read this process's own state)."""
        out: list[tuple[tuple[str, ...], Reported]] = []
        for values, child in list(self._children.items()):
            if isinstance(child, HistogramChild):
                out.append((values, (list(child.counts), child.sum)))
            elif not isinstance(child, GaugeChild) or child.function is None:
                out.append((values, child.value))
        return out

    def merge_peer(self, peer: int, entries: Sequence[tuple[tuple[str, ...], Reported]]) -> None:
        """Record another process's :meth:`snapshot` entries (its running totals: the latest replaces that
        process's previous ones); collections report the sum over this process and every peer."""
        self._peers.setdefault(peer, {}).update(entries)

    def _local(self) -> Iterator[tuple[tuple[str, ...], Reported]]:
        for values, child in list(self._children.items()):
            if isinstance(child, HistogramChild):
                yield values, (list(child.counts), child.sum)
            else:
                yield values, child.get() if isinstance(child, GaugeChild) else child.value

    def _values(self) -> Iterator[tuple[tuple[str, ...], Reported]]:
        """(label values, number or (bucket counts, sum)) to report: this process's, plus its peers'."""
        if not self._peers:
            yield from self._local()
            return
        merged: dict[tuple[str, ...], Reported] = {}
        for entries in (list(self._local()), *(list(p.items()) for p in self._peers.values())):
            for values, value in entries:
                merged[values] = _add(merged.get(values), value)
        yield from merged.items()

    # -- Collector ----------------------------------------------------------------------------------------------

    def describe(self) -> list[Metric]:
        return [self._family()]

    @abstractmethod
    def _family(self) -> Metric:
        """An empty metric family of this kind, name, help and labels (``collect`` fills one per kind)."""


class CounterFamily(Family[CounterChild]):
    """A counter family: see :func:`counter`."""

    kind = "counter"

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, value in self._values():
            family.add_metric(list(values), _number(value))
        yield family


class GaugeFamily(Family[GaugeChild]):
    """A gauge family: see :func:`gauge`."""

    kind = "gauge"

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, value in self._values():
            family.add_metric(list(values), _number(value))
        yield family


class HistogramFamily(Family[HistogramChild]):
    """A histogram family: see :func:`histogram`."""

    kind = "histogram"

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, value in self._values():
            if not isinstance(value, tuple):
                raise TypeError(f"{self.name}: a histogram series reports (bucket counts, sum), not {value!r}")
            counts, total_sum = value
            buckets: list[tuple[str, float]] = []
            total = 0
            for bound, count in zip((*self.bounds, float("inf")), counts):
                total += count
                buckets.append((floatToGoString(bound), total))
            family.add_metric(list(values), buckets, total_sum)
        yield family


def _number(value: Reported) -> float:
    if isinstance(value, tuple):
        raise TypeError(f"a counter or gauge series reports a number, not {value!r}")
    return value


def _add(a: Reported | None, b: Reported) -> Reported:
    """Sum of two reported values: numbers, or (bucket counts, sum) pairs of the same histogram."""
    if a is None:
        return b
    if isinstance(a, tuple) and isinstance(b, tuple):
        return [x + y for x, y in zip(a[0], b[0])], a[1] + b[1]
    return _number(a) + _number(b)


def counter(name: str, documentation: str, labelnames: Sequence[str] = (), *,
            registry: CollectorRegistry) -> CounterFamily:
    """A counter family (exported as ``<name>_total``; a trailing ``_total`` in ``name`` is dropped)."""
    return CounterFamily(name, documentation, labelnames, registry=registry)


def gauge(name: str, documentation: str, labelnames: Sequence[str] = (), *,
          registry: CollectorRegistry) -> GaugeFamily:
    """A gauge family."""
    return GaugeFamily(name, documentation, labelnames, registry=registry)


def histogram(name: str, documentation: str, labelnames: Sequence[str] = (), *, buckets: Sequence[float],
              registry: CollectorRegistry) -> HistogramFamily:
    """A histogram family with the given upper bounds (``+Inf`` is implied)."""
    return HistogramFamily(name, documentation, labelnames, registry=registry, buckets=buckets)


FamilyT = TypeVar("FamilyT", bound=Family[Any])


def renamed(factory: Callable[..., FamilyT], old: str, new: str, documentation: str, labelnames: Sequence[str] = (),
            *, registry: CollectorRegistry, new_labelnames: Sequence[str] | None = None, mark: bool = True,
            **kwargs: Any) -> FamilyT:
    """A metric exported under its deprecated name ``old`` and its successor ``new`` (a :meth:`Family.twin`):
    ``factory(old, ...)``, whose HELP is ``documentation`` after ``[Deprecated: Use <new>] `` when ``mark``, and
    ``new`` with HELP ``documentation`` and ``new_labelnames`` (default ``labelnames``), both on ``registry``.
    Returns the first, through which both are recorded."""
    prefix = f"[Deprecated: Use {new}] " if mark else ""
    family = factory(old, prefix + documentation, labelnames, registry=registry, **kwargs)
    family.twin(new, documentation, new_labelnames, registry=registry)
    return family


class LabelCap:
    """Bounds the distinct values of one client-chosen label (the reference's ``--fairness-id-metric-label-limit``,
    and EPP's ``--model-name-metric-label-limit``). A value ``known(value)`` accepts (a model the pool serves) passes
    unchanged; of the others, the first ``limit`` distinct ones pass unchanged for the life of the process and any
    later new one reads :attr:`OVERFLOW`; ``limit`` 0 folds every unknown value. Call it on the value before
    choosing a series: a value seen before costs one set lookup.

    A value passed once passes for good (its series stay). A folded value is not remembered (that memory would grow
    with what clients send), so it passes later if ``known`` accepts it by then: a gauge incremented under
    ``other`` must be decremented under the label it was incremented with (:meth:`EppMetrics.running_inc
    <epp.metrics.families.EppMetrics.running_inc>` keeps it)."""

    __slots__ = ("limit", "known", "_seen", "_unknown")
    OVERFLOW = "other"

    def __init__(self, limit: int, known: Callable[[str], bool] | None = None) -> None:
        if limit < 0:
            raise ValueError(f"label limit must be non-negative, got {limit}")
        self.limit = limit
        self.known = known
        self._seen: set[str] = set()
        self._unknown = 0  # values in _seen that took one of the ``limit`` places

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        return self._admit(value)

    def _admit(self, value: str) -> str:
        known = self.known
        if known is not None and known(value):
            self._seen.add(value)  # served values are bounded by the pool's model list, not by clients
            return value
        if self._unknown < self.limit:
            self._unknown += 1
            self._seen.add(value)
            return value
        return self.OVERFLOW
