"""Admission with flow control off (the default): the reference's legacy path.

Only sheddable requests (priority < 0) are checked: they get :class:`~epp.errors.Saturated` (429, reason
``pool_saturated``) when the saturation over their candidates is at least 1.0. Everything else passes at once.
"""

from __future__ import annotations

from typing import Any

from epp.errors import Saturated
from epp.flowcontrol.base import Admission, Candidates, Reason
from epp.flowcontrol.metrics import FlowControlMetrics
from epp.framework.plugins import SaturationDetector
from epp.framework.request import InferenceRequest

__all__ = ["LegacyAdmission", "NoopAdmission"]


class NoopAdmission:
    """An admission that holds nothing; ``release`` only records that it happened (idempotent)."""

    __slots__ = ("released",)
    waited = 0.0

    def __init__(self) -> None:
        self.released = False

    def release(self) -> None:
        self.released = True

    def __enter__(self) -> NoopAdmission:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class LegacyAdmission:
    """Sheddable requests are dropped when the pool is saturated; nothing waits."""

    def __init__(self, detector: SaturationDetector, metrics: FlowControlMetrics | None = None) -> None:
        self.detector = detector
        self.metrics = metrics
        self.rejected = 0

    async def admit(self, request: InferenceRequest, candidates: Candidates) -> Admission:
        """Pass, or raise ``Saturated`` for a sheddable request when saturation ≥ 1.0."""
        if request.sheddable:
            saturation = self.detector.saturation(candidates())
            if self.metrics is not None:
                self.metrics.saturation(saturation)
            if saturation >= 1.0:
                self.rejected += 1
                if self.metrics is not None:
                    self.metrics.rejected(request, Reason.POOL_SATURATED)
                raise Saturated("system saturated, sheddable request dropped", reason=Reason.POOL_SATURATED)
        return NoopAdmission()

    async def start(self) -> None:
        """Nothing runs in the background."""

    async def stop(self) -> None:
        """Nothing runs in the background."""

    def snapshot(self) -> dict[str, Any]:
        """Flow control is off: there are no tenants or queues to show."""
        return {"flowControl": False, "sheddableRejected": self.rejected, "tenants": {}}
