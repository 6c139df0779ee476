"""``kv-capacity-filter`` (EPP's own): keeps endpoints whose free KV cache can hold the whole request, so a pick
never forces the server to preempt running sequences.

Per endpoint (``B`` = its scraped block size in tokens, 16 when unknown)::

    tokens = input_tokens + max_tokens         # max_tokens unset: the reference's estimate, 1.5 x input_tokens
    need   = ceil(tokens / B)                  # blocks
    free   = num_gpu_blocks * (1 - kv_usage)   # kv_usage clamped to [0, 1]
    keep if free >= need;  endpoints whose num_gpu_blocks is unknown always pass

If no endpoint can hold the request it keeps them all (a preemption beats a failed request).

YAML::

    - type: kv-capacity-filter
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Filter, Handle, NoParams
from epp.framework.request import InferenceRequest

__all__ = ["KvCapacityFilter", "DEFAULT_BLOCK_SIZE"]

DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size


class KvCapacityFilter:
    """Keeps endpoints with at least ``ceil((prompt + max_tokens) / block_size)`` free KV blocks."""

    type_name: ClassVar[str] = "kv-capacity-filter"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        tokens = request.estimated_total_tokens
        kept: list[Endpoint] = []
        for ep in endpoints:
            m = ep.metrics
            if not m.num_gpu_blocks:
                kept.append(ep)
                continue
            block = m.block_size or DEFAULT_BLOCK_SIZE
            need = -(-tokens // block)
            usage = 0.0 if m.kv_usage < 0.0 else 1.0 if m.kv_usage > 1.0 else m.kv_usage
            if m.num_gpu_blocks * (1.0 - usage) >= need:
                kept.append(ep)
        return kept or endpoints


_check: type[Filter] = KvCapacityFilter
