"""The request path's metric series of one (model, target model, fairness id, priority), resolved once and kept.

The reference records each request metric under two families whose labels differ: the deprecated
``inference_objective_*`` one (``model_name, target_model_name``, plus ``priority`` on the request counter; only
``model_name`` on the running gauge) and its ``llm_d_epp_*`` replacement (``model_name, target_model_name,
fairness_id, priority``). A twin cannot share series then, so :class:`RequestSeries` binds, on first use, one tee per
family pair: :class:`CountTee` for counters and gauges, :class:`~epp.metrics.instruments.HistogramTee` for histograms (one
bucket search for both). :class:`epp.metrics.families.EppMetrics` keeps one per label set: a request's recording finds its
series with one dictionary lookup, then each operation updates both families without another lookup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from epp.metrics.instruments import Child, HistogramChild, HistogramTee

if TYPE_CHECKING:
    from epp.metrics.families import EppMetrics

__all__ = ["CountTee", "RequestSeries"]


class CountTee:
    """A counter or gauge series of the deprecated family and its replacement's, changed as one."""

    __slots__ = ("first", "second")

    def __init__(self, first: Child, second: Child) -> None:
        self.first, self.second = first, second

    def inc(self) -> None:
        """Add 1 to both."""
        self.first.value += 1.0  # type: ignore[union-attr]
        self.second.value += 1.0  # type: ignore[union-attr]

    def dec(self) -> None:
        """Subtract 1 from both (gauges)."""
        self.first.value -= 1.0  # type: ignore[union-attr]
        self.second.value -= 1.0  # type: ignore[union-attr]


# attribute -> (deprecated family, replacement family) on EppMetrics: the tees RequestSeries binds by name.
_PAIRS = {"requests": ("requests", "llmd_requests"), "running": ("running", "llmd_running"),
          "duration": ("duration", "llmd_duration"), "request_sizes": ("request_sizes", "llmd_request_sizes"),
          "response_sizes": ("response_sizes", "llmd_response_sizes"),
          "input_tokens": ("input_tokens", "llmd_input_tokens"),
          "output_tokens": ("output_tokens", "llmd_output_tokens"),
          "cached_tokens": ("cached_tokens", "llmd_cached_tokens"), "ntpot": ("ntpot", "llmd_ntpot")}


class RequestSeries:
    """One label set's request-path series, each bound on first use (a labelled child appears in the exposition
    only once recorded into). The label values are the bounded ones (:meth:`epp.metrics.families.EppMetrics.series`)."""

    __slots__ = ("_metrics", "_legacy", "_labels", "cached_tokens", "duration", "errors", "input_tokens", "itl",
                 "ntpot", "output_tokens", "request_sizes", "requests", "response_sizes", "running", "tpot", "ttft")

    def __init__(self, metrics: EppMetrics, model: str, target: str, fairness_id: str, priority: int) -> None:
        self._metrics = metrics
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

    def bind(self, name: str) -> Any:
        """The tee of the :data:`_PAIRS` entry ``name``, created and kept now."""
        m = self._metrics
        legacy_name, new_name = _PAIRS[name]
        legacy_family, new_family = getattr(m, legacy_name), getattr(m, new_name)
        model, target, priority = self._legacy
        if name == "requests":
            legacy = legacy_family.labels(model, target, priority)
        elif name == "running":
            legacy = legacy_family.labels(model)
        else:
            legacy = legacy_family.labels(model, target)
        new = new_family.labels(*self._labels)
        tee = HistogramTee(legacy, new) if new_family.kind == "histogram" else CountTee(legacy, new)
        setattr(self, name, tee)
        return tee

    def bind_new(self, name: str) -> HistogramChild:
        """The series of the replacement-only family ``name`` (``tpot``, ``itl``), created and kept now."""
        child = getattr(self._metrics, name).labels(*self._labels)
        setattr(self, name, child)
        return child  # type: ignore[return-value]

    def bind_ttft(self, streaming: bool) -> HistogramChild:
        """The TTFT series of this ``streaming`` label value, created and kept now."""
        child = self.ttft[streaming] = self._metrics.ttft.labels(*self._labels, "true" if streaming else "false")
        return child  # type: ignore[return-value]

    def bind_error(self, code: str) -> CountTee:
        """The error counters of ``code``, created and kept now."""
        m = self._metrics
        model, target, _ = self._legacy
        tee = self.errors[code] = CountTee(m.errors.labels(model, target, code), m.llmd_errors.labels(*self._labels,
                                                                                                       code))
        return tee
