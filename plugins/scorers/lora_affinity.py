"""``lora-affinity-scorer``: prefers endpoints that already run the request's LoRA adapter, then free slots.

Formula (``m`` = the request's adapter, or its target model; sets from ``vllm:lora_requests_info``)::

    1.0  if m in running_loras
    0.8  elif len(running_loras) + len(waiting_loras) < max_lora      # a free adapter slot
    0.6  elif m in waiting_loras
    0.0  otherwise

A base-model request on servers without LoRA (``max_lora`` 0) scores 0 everywhere, so it does not bias the pick.

YAML::

    - type: lora-affinity-scorer
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, NoParams, Scorer
from epp.framework.request import InferenceRequest

__all__ = ["LoraAffinityScorer"]


class LoraAffinityScorer:
    """1.0 adapter loaded, 0.8 free slot, 0.6 adapter queued, else 0 (the reference's tiers)."""

    type_name: ClassVar[str] = "lora-affinity-scorer"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        model = request.lora_adapter or request.target_model
        out: list[float] = []
        for ep in endpoints:
            m = ep.metrics
            if model in m.running_loras:
                out.append(1.0)
            elif len(m.running_loras) + len(m.waiting_loras) < m.max_lora:
                out.append(0.8)
            elif model in m.waiting_loras:
                out.append(0.6)
            else:
                out.append(0.0)
        return out


_check: type[Scorer] = LoraAffinityScorer
