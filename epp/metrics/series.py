"""The request path's metric series of one (model, target model, fairness id, priority), resolved once and kept.

The reference records each request metric under two families whose labels differ: the deprecated
``inference_objective_*`` one (``model_name, target_model_name``, plus ``priority`` on the request counter; only
``model_name`` on the running gauge) and its ``llm_d_epp_*`` replacement (``model_name, target_model_name,
fairness_id, priority``). A twin cannot share series then, so :class:`RequestSeries` binds, on first use, one tee per
family pair: :class:`CountTee` for counters and gauges, :class:`~epp.metrics.instruments.HistogramTee` for
histograms (one bucket search for both). :class:`epp.metrics.families.EppMetrics` keeps one per label set: a request's
recording finds its series with one dictionary lookup, then each operation updates both families without another lookup.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epp.metrics.instruments import (
    CounterChild,
    CounterFamily,
    GaugeChild,
    GaugeFamily,
    HistogramChild,
    HistogramFamily,
    HistogramTee,
)

__all__ = ["CountTee", "RequestFamilies", "RequestSeries"]


class CountTee:
    """A counter or gauge series of the deprecated family and its replacement's, changed as one."""

    __slots__ = ("first", "second")

    def __init__(self, first: CounterChild | GaugeChild, second: CounterChild | GaugeChild) -> None:
        self.first, self.second = first, second

    def inc(self) -> None:
        """Add 1 to both."""
        self.first.value += 1.0
        self.second.value += 1.0

    def dec(self) -> None:
        """Subtract 1 from both (gauges)."""
        self.first.value -= 1.0
        self.second.value -= 1.0


CountFamily = CounterFamily | GaugeFamily


@dataclass(frozen=True, slots=True)
class RequestFamilies:
    """The families a :class:`RequestSeries` binds its series from (the owner of the families builds it once).

    ``counts`` and ``histograms``: by :class:`RequestSeries` attribute, (deprecated family, replacement family);
    ``new_only``: the replacement-only histograms (``tpot``, ``itl``) by attribute; ``ttft`` has a ``streaming``
    label after the replacement labels; ``errors`` an ``error_code`` label after each family's others."""

    counts: Mapping[str, tuple[CountFamily, CountFamily]]
    histograms: Mapping[str, tuple[HistogramFamily, HistogramFamily]]
    new_only: Mapping[str, HistogramFamily]
    ttft: HistogramFamily
    errors: tuple[CounterFamily, CounterFamily]


class RequestSeries:
    """One label set's request-path series, each bound on first use (a labelled child appears in the exposition
    only once recorded into). The label values are the bounded ones (:meth:`epp.metrics.families.EppMetrics.series`)."""

    __slots__ = ("_families", "_legacy", "_labels", "cached_tokens", "duration", "errors", "input_tokens", "itl",
                 "ntpot", "output_tokens", "request_sizes", "requests", "response_sizes", "running", "tpot", "ttft")

    def __init__(self, families: RequestFamilies, model: str, target: str, fairness_id: str, priority: int) -> None:
        self._families = families
        self._legacy = (model, target, str(priority))
        self._labels = (model, target, fairness_id, str(priority))
        self.requests: CountTee | None = None
        self.running: CountTee | None = None
        self.duration: HistogramTee | None = None
        self.request_sizes: HistogramTee | None = None
        self.response_sizes: HistogramTee | None = None
        self.input_tokens: HistogramTee | None = None
        self.output_tokens: HistogramTee | None = None
        self.cached_tokens: HistogramTee | None = None
        self.ntpot: HistogramTee | None = None
        self.tpot: HistogramChild | None = None
        self.itl: HistogramChild | None = None
        self.ttft: dict[bool, HistogramChild] = {}
        self.errors: dict[str, CountTee] = {}

    def bind_count(self, name: str) -> CountTee:
        """The tee of the :attr:`RequestFamilies.counts` entry ``name``, created and kept now."""
        legacy_family, new_family = self._families.counts[name]
        model, target, priority = self._legacy
        # The deprecated families' labels differ: the request counter has ``priority``, the running gauge only
        # ``model_name``.
        legacy = legacy_family.labels(model, target, priority) if name == "requests" else legacy_family.labels(model)
        tee = CountTee(legacy, new_family.labels(*self._labels))
        setattr(self, name, tee)
        return tee

    def bind_histogram(self, name: str) -> HistogramTee:
        """The tee of the :attr:`RequestFamilies.histograms` entry ``name``, created and kept now."""
        legacy_family, new_family = self._families.histograms[name]
        model, target, _ = self._legacy
        tee = HistogramTee(legacy_family.labels(model, target), new_family.labels(*self._labels))
        setattr(self, name, tee)
        return tee

    def bind_new(self, name: str) -> HistogramChild:
        """The series of the replacement-only family ``name`` (``tpot``, ``itl``), created and kept now."""
        child = self._families.new_only[name].labels(*self._labels)
        setattr(self, name, child)
        return child

    def bind_ttft(self, streaming: bool) -> HistogramChild:
        """The TTFT series of this ``streaming`` label value, created and kept now."""
        child = self.ttft[streaming] = self._families.ttft.labels(*self._labels, "true" if streaming else "false")
        return child

    def bind_error(self, code: str) -> CountTee:
        """The error counters of ``code``, created and kept now."""
        legacy_family, new_family = self._families.errors
        model, target, _ = self._legacy
        tee = self.errors[code] = CountTee(legacy_family.labels(model, target, code),
                                           new_family.labels(*self._labels, code))
        return tee
