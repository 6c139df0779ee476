"""``kv-capacity-filter`` (EPP's own): keeps endpoints whose free KV cache can hold the whole request, so a pick
never forces the server to preempt running sequences.

Per endpoint (``B`` = its scraped block size in tokens, 16 when unknown)::

    tokens = input_tokens + max_tokens         # max_tokens unset: the reference's estimate, 1.5 x input_tokens
    tokens -= the prefix the endpoint holds    # only with prefixMatchInfoProducerName (off by default)
    need   = ceil(tokens / B)                  # blocks
    free   = num_gpu_blocks * (1 - kv_usage)   # kv_usage clamped to [0, 1]
    keep if free >= need;  endpoints whose num_gpu_blocks is unknown always pass

If no endpoint can hold the request it keeps them all (a preemption beats a failed request).

The prefix discount assumes the held prefix is shared with running requests (a busy hot prefix): an idle cached
prefix sits in vLLM's free pool, and a hit takes it out again.

YAML::

    - type: kv-capacity-filter
      parameters:
        prefixMatchInfoProducerName: approx-prefix-cache-producer   # optional
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Filter, Handle
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

from ..producers.approx_prefix_cache import PRODUCER_TYPE, PrefixMatch, find_prefix_producer

__all__ = ["KvCapacityFilter", "DEFAULT_BLOCK_SIZE"]

DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size


class KvCapacityFilter:
    """Keeps endpoints with at least ``ceil((prompt + max_tokens) / block_size)`` free KV blocks."""

    type_name: ClassVar[str] = "kv-capacity-filter"

    class Params(PluginParams):
        prefix_match_info_producer_name: str | None = Field(None, alias="prefixMatchInfoProducerName")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        # Named, the prefix producer is read, so the loader creates a missing approximate one as for other readers.
        self.consumes = (PRODUCER_TYPE,) if params.prefix_match_info_producer_name else ()
        self._key: str | None = None

    @classmethod
    def producer_params(cls, params: object) -> dict[str, object]:
        """No prefix-producer parameters of its own: an auto-created producer uses the defaults."""
        return {}

    def bind(self, handle: Handle) -> None:
        named = self.params.prefix_match_info_producer_name
        if named:
            self._key = find_prefix_producer(self, handle, producer_name=named).state_key

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        total = request.estimated_total_tokens
        match = cycle.get(self._key) if self._key else None
        match = match if isinstance(match, PrefixMatch) else None
        kept: list[Endpoint] = []
        for ep in endpoints:
            m = ep.metrics
            if not m.num_gpu_blocks:
                kept.append(ep)
                continue
            block = m.block_size or DEFAULT_BLOCK_SIZE
            tokens = total
            if match is not None:
                tokens = max(0, total - match.cached_tokens(ep.name))
            need = -(-tokens // block)
            usage = 0.0 if m.kv_usage < 0.0 else 1.0 if m.kv_usage > 1.0 else m.kv_usage
            if m.num_gpu_blocks * (1.0 - usage) >= need:
                kept.append(ep)
        return kept or endpoints


_check: type[Filter] = KvCapacityFilter
