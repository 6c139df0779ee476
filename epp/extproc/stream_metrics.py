"""The ext_proc gRPC stream metrics of ``--enable-grpc-stream-metrics``, as the reference's.

Three families, on the registry of EPP's other metrics and only when the flag is on: ``Process`` streams open now
(``llm_d_epp_extproc_streams_inflight``), how long each stayed open (``..._stream_duration_seconds``) and streams
ended by gRPC status code (``..._streams_total{code}``). A stream counts from when ``Process`` starts serving it to
when the call ends; a reset, a lost connection or shutdown ends it as ``Unknown``. Both transports record through
:class:`StreamMetrics`; with the flag off they hold None and record nothing.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from epp.metrics.instruments import CounterChild, Family, counter, gauge, histogram

__all__ = ["StreamMetrics", "CODE_NAMES", "UNKNOWN"]

_PREFIX = "llm_d_epp_extproc_"
_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600)

CODE_NAMES = ("OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists",
              "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
              "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated")
"""gRPC status code number -> its name as Go's ``codes.Code.String()`` spells it (the ``code`` label)."""

UNKNOWN = 2
"""The code a reset or lost stream is recorded with."""


class StreamMetrics:
    """The three families on ``registry`` and the two calls a transport makes per stream.

    Contract: :meth:`started` once when a ``Process`` stream starts serving, then exactly one :meth:`finished`
    with the value it returned, from the event loop's thread (as every :mod:`epp.metrics.instruments` recorder)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.inflight = gauge(_PREFIX + "streams_inflight", "[ALPHA] Number of ext_proc gRPC streams currently "
                              "open.", registry=registry)
        self.duration = histogram(_PREFIX + "stream_duration_seconds", "[ALPHA] Duration an ext_proc gRPC stream "
                                  "stays open, in seconds.", buckets=_BUCKETS, registry=registry)
        self.total = counter(_PREFIX + "streams_total", "[ALPHA] Total ext_proc gRPC streams completed, by gRPC "
                             "status code.", ("code",), registry=registry)
        # The label-less series exist from the start (0), as the reference's Go gauge and histogram do.
        self._inflight = self.inflight.labels()
        self._duration = self.duration.labels()
        self._codes: dict[int, CounterChild] = {}

    def families(self) -> list[Family]:
        """The three families (what ``--workers`` peers report to worker 0)."""
        return [self.inflight, self.duration, self.total]

    def started(self) -> float:
        """A stream opened; returns its start time for :meth:`finished`."""
        self._inflight.inc()
        return time.monotonic()

    def finished(self, code: int, started: float) -> None:
        """The stream that :meth:`started` at ``started`` ended with gRPC status ``code`` (a number)."""
        self._inflight.dec()
        self._duration.observe(time.monotonic() - started)
        child = self._codes.get(code)
        if child is None:
            name = CODE_NAMES[code] if 0 <= code < len(CODE_NAMES) else f"Code({code})"
            child = self._codes[code] = self.total.labels(name)
        child.inc()
