"""``no-hit-lru-scorer``: spreads cold requests (no prefix hit anywhere) over least-recently-cold endpoints.

A request is *cold* when no candidate holds any of its prefix blocks (or there is no prefix match info). Cold
requests create the most new KV blocks, so sending them round the pool spreads cache growth. The scorer keeps an
LRU (``lruSize`` endpoints) of the endpoints that received cold requests; ``n`` = number of candidates::

    warm request:           0.5 for every endpoint
    cold, n == 1:           1.0
    cold, never-used ep i:  1 - i / (n - 1)                    # i = its position among never-used candidates
    cold, used ep:          max(0, 1 - (never_used + pos) / (n - 1))   # pos = LRU position, 0 = oldest

As a PreRequest hook it moves the primary target and the prefill endpoint of a cold request to the LRU's
most-recent end. ``prefixMatchInfoProducerName`` names the prefix producer to read.

YAML::

    - type: no-hit-lru-scorer
      parameters:
        lruSize: 1024
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, ClassVar

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, PreRequest, SchedulingResult, Scorer
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

from ..fallback import fall_back
from ..producers.approx_prefix_cache import DEFAULT_PREFILL_PROFILE, PRODUCER_TYPE, PrefixMatch, find_prefix_producer

__all__ = ["NoHitLruScorer"]


class NoHitLruScorer:
    """LRU rank among endpoints that received cold requests; neutral 0.5 for requests with a prefix hit."""

    type_name: ClassVar[str] = "no-hit-lru-scorer"
    consumes: ClassVar[tuple[str, ...]] = (PRODUCER_TYPE,)

    class Params(PluginParams):
        prefix_plugin_type: str | None = Field(None, alias="prefixPluginType")
        prefix_plugin_name: str | None = Field(None, alias="prefixPluginName")
        lru_size: int = Field(1024, alias="lruSize")
        prefix_match_info_producer_name: str | None = Field(None, alias="prefixMatchInfoProducerName")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._size = fall_back(self, "lruSize", params.lru_size, 1024, params.lru_size > 0)
        self._lru: OrderedDict[str, None] = OrderedDict()
        self._prefix_key = ""
        self._cold_key = f"{self.type_name}/{name}/cold"

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """No producer parameters of its own: an auto-created producer uses the defaults."""
        return {}

    def bind(self, handle: Handle) -> None:
        """Find the prefix producer: the one ``prefixMatchInfoProducerName`` names, else through
        ``prefixPluginName`` (or the first ``prefixPluginType``) if present."""
        name = self.params.prefix_match_info_producer_name
        via = self.params.prefix_plugin_name
        if not via and self.params.prefix_plugin_type:
            typed = handle.first_of_type(self.params.prefix_plugin_type)
            via = typed.name if typed is not None else None
        self._prefix_key = find_prefix_producer(self, handle, via=via, producer_name=name).state_key

    def lru_order(self) -> list[str]:
        """Endpoint names in LRU order, least recently cold first."""
        return list(self._lru)

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        state = cycle.get(self._prefix_key)
        cold = not (isinstance(state, PrefixMatch) and any(state.matches.get(ep.name) for ep in endpoints))
        cycle[self._cold_key] = cold
        if not cold:
            return [0.5] * len(endpoints)
        n = len(endpoints)
        if n == 1:
            return [1.0]
        positions = {name: i for i, name in enumerate(self._lru)}
        never_used = sum(1 for ep in endpoints if ep.name not in positions)
        out: list[float] = []
        rank_new = 0
        for ep in endpoints:
            pos = positions.get(ep.name)
            if pos is None:
                out.append(1.0 - rank_new / (n - 1))
                rank_new += 1
            else:
                out.append(max(0.0, 1.0 - (never_used + pos) / (n - 1)))
        return out

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """Mark the targets of a cold request as most recently used."""
        if not result.cycle.get(self._cold_key):
            return
        if result.endpoints:
            self._touch(result.endpoints[0].name)
        prefill = result.profile_results.get(result.prefill_profile or DEFAULT_PREFILL_PROFILE)
        if prefill is not None and prefill.endpoints:
            self._touch(prefill.endpoints[0].name)

    def _touch(self, name: str) -> None:
        lru = self._lru
        if name in lru:
            lru.move_to_end(name)
        else:
            lru[name] = None
            if len(lru) > self._size:
                lru.popitem(last=False)


_check: type[Scorer] = NoHitLruScorer
_check_pre: type[PreRequest] = NoHitLruScorer
