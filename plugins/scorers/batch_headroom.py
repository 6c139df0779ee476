"""``batch-headroom-scorer`` (EPP's own): prefers endpoints with free slots in their running batch.

A vLLM server runs at most ``max_num_seqs`` sequences at once; a request sent to a full batch waits. The scraped
``running``/``waiting`` lag behind EPP's dispatches by up to one scrape interval, while
:attr:`Endpoint.inflight_requests` (dispatched by this EPP, not yet finished) is current but blind to other
clients. The scorer counts whichever is larger as occupied::

    cap      = maxNumSeqs parameter if set, else the scraped max_num_seqs
    occupied = max(running + waiting, inflight_requests)
    score    = max(0, cap - occupied) / cap          # 1 = empty batch, 0 = full or queueing
    score    = 0.5                                   # capacity unknown (neither set nor scraped)

YAML::

    - type: batch-headroom-scorer
      parameters:
        maxNumSeqs: 256     # optional; overrides the scraped value for every endpoint
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, Scorer
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

__all__ = ["BatchHeadroomScorer", "UNKNOWN_CAPACITY_SCORE"]

UNKNOWN_CAPACITY_SCORE = 0.5


class BatchHeadroomScorer:
    """Fraction of the batch capacity still free: ``max(0, cap - max(running + waiting, inflight)) / cap``."""

    type_name: ClassVar[str] = "batch-headroom-scorer"

    class Params(PluginParams):
        max_num_seqs: int | None = Field(None, alias="maxNumSeqs", ge=1)

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._cap = params.max_num_seqs

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        fixed = self._cap
        out: list[float] = []
        for ep in endpoints:
            m = ep.metrics
            cap = fixed or m.max_num_seqs
            if not cap or cap <= 0:
                out.append(UNKNOWN_CAPACITY_SCORE)
                continue
            occupied = max(m.running + m.waiting, ep.inflight_requests)
            out.append(max(0, cap - occupied) / cap)
        return out


_check: type[Scorer] = BatchHeadroomScorer
