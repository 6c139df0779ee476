"""Where a shared prompt prefix may go: the ttft-cost-scorer's ``spill`` and ``fitPlacement`` repricing.

Given the candidates' matched blocks (``held``), bookings and uncached tokens, :meth:`SharedPlacement.repriced` says
which endpoints the scorer prices at other uncached tokens than their own (and does not charge as a move):
- ``spill``: while every endpoint holding the most of the prompt has queued work, each endpoint with none that lacks
  at most ``spillTokens`` of it is priced as a holder; with ``spillShares`` only a prefix that many requests matched
  (a session's history is not), with ``spillRoom`` only where every shared prefix fits in that share of its KV;
- ``fitPlacement``: while every shared prefix fits in ``spillRoom`` of the smallest candidate's KV, every server soon
  holds every shared prefix anyway, so a request whose prefix is shared prices every endpoint as holding none of it.
Shared prefixes and their working set are kept by :class:`.shared_prefixes.SharedPrefixes`. Measurements:
docs/routing.md.
"""

from __future__ import annotations

from typing import Callable

from epp.framework.endpoint import Endpoint

from ..producers.approx_prefix_cache import PrefixMatch
from .shared_prefixes import SharedPrefixes
from .ttft_bookings import EndpointLoad

BLOCK_TOKENS = 16
"""vLLM's default KV block size, for a server whose scrape does not say."""


class SharedPlacement:
    """The spill and fit rules over one registry of shared prefixes (None: neither shares nor room is set)."""

    def __init__(self, shared: SharedPrefixes | None, *, spill: bool, spill_tokens: int, shares: int, room: float,
                 fit: bool, clock: Callable[[], float]) -> None:
        self._shared = shared
        self._spill, self._spill_tokens, self._shares, self._room, self._fit = spill, spill_tokens, shares, room, fit
        self._clock = clock

    def repriced(self, match: PrefixMatch | None, held: list[int], endpoints: list[Endpoint],
                 loads: list[EndpointLoad], uncached: list[float]) -> tuple[dict[int, float], bool]:
        """The repriced endpoints by index with the uncached tokens they are priced at, and whether the shared
        prefixes fit (``fitPlacement``: the scorer then counts queued work ``fitPendingWeight`` times)."""
        fits = self._fit and self._fits(endpoints, match, held)
        if match is None:
            return {}, fits
        if fits:
            return self._unsteered(match, held, uncached), fits
        return (self._spill_targets(match, held, endpoints, loads, uncached) if self._spill else {}), fits

    def sighted(self, match: PrefixMatch) -> None:
        """Count a routed request for the prefix its holders hold."""
        most = max(match.matches.values(), default=0)
        if most and self._shared is not None:
            self._shared.sighted(match.hashes[most - 1], most * match.block_size_tokens, self._clock())

    def _spill_targets(self, match: PrefixMatch, held: list[int], endpoints: list[Endpoint],
                       loads: list[EndpointLoad], uncached: list[float]) -> dict[int, float]:
        most = max(held, default=0)
        holders = [i for i, blocks in enumerate(held) if blocks == most]
        if most == 0 or any(loads[i].pending_tokens == 0 for i in holders):
            return {}
        key = match.hashes[most - 1]
        if self._shared is not None and self._shared.sightings(key) + 1 < self._shares:  # +1: this request
            return {}
        working = self._working_set(key, most * match.block_size_tokens)
        priced = uncached[holders[0]]
        return {i: priced for i, blocks in enumerate(held)
                if blocks < most and loads[i].pending_tokens == 0
                and uncached[i] - priced <= self._spill_tokens
                and (working is None or working <= self._room_tokens(endpoints[i]))}

    def _fits(self, endpoints: list[Endpoint], match: PrefixMatch | None, held: list[int]) -> bool:
        """Whether every shared prefix, this request's among them, fits in ``spillRoom`` of the smallest candidate's
        KV cache (none does while a candidate's size is unknown)."""
        room = min((self._room_tokens(ep) for ep in endpoints), default=0.0)
        most = max(held, default=0)
        if match is None or most == 0:
            working = self._shared.working_set(self._clock()) if self._shared is not None else None
        else:
            working = self._working_set(match.hashes[most - 1], most * match.block_size_tokens)
        return room > 0 and working is not None and working <= room

    def _unsteered(self, match: PrefixMatch, held: list[int], uncached: list[float]) -> dict[int, float]:
        """For a request whose prefix is shared, every endpoint, priced as holding none of it (the most uncached
        tokens), so the cache does not steer where it goes and a copy evicts no other shared prefix."""
        most = max(held, default=0)
        if most == 0 or self._shared is None:
            return {}
        if self._shared.sightings(match.hashes[most - 1]) + 1 < self._shares:  # +1: this request
            return {}
        top = max(uncached)
        return {i: top for i in range(len(held))}

    def _working_set(self, key: int, tokens: float) -> float | None:
        """``spillRoom``: the tokens of every shared prefix, this one (``key``, ``tokens`` long) among them; None
        without the setting."""
        shared = self._shared
        if not self._room or shared is None:
            return None
        working = shared.working_set(self._clock())
        if shared.sightings(key) < max(1, self._shares):  # not shared yet, so not counted in it
            working += tokens
        return working

    def _room_tokens(self, endpoint: Endpoint) -> float:
        """``spillRoom``'s share of ``endpoint``'s KV cache in tokens: 0 if its scrape does not give the size."""
        metrics = endpoint.metrics
        return self._room * (metrics.num_gpu_blocks or 0) * (metrics.block_size or BLOCK_TOKENS)
