"""Shared prompt prefixes and their working set: the ttft-cost-scorer's ``spillShares``/``spillRoom`` registry.

A prefix is keyed by the hash of the last block its holders hold, so a session's history, which grows with every
turn, gets a new key at every turn and is never shared, while an app's system prompt keeps one key. Each routed
request is one sighting of its key; a key sighted at least ``shares`` times is shared. The working set is the tokens
of the shared prefixes sighted within the last ``window`` seconds, summed: what one server holds to serve every
shared prefix without evicting another. The table is bounded (the least recently sighted leaves first) and per
process: ``--workers`` each keep their own.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_PREFIXES = 16_384
"""Prefixes remembered at most: a stream of unrelated prompts pushes out the oldest, not memory."""


@dataclass(slots=True)
class _Prefix:
    sightings: int
    tokens: float
    last: float


class SharedPrefixes:
    """Sightings per prefix key and the tokens of the shared ones, in order of last sighting."""

    def __init__(self, shares: int, window: float, capacity: int = MAX_PREFIXES) -> None:
        self._shares = max(1, shares)
        self._window = window
        self._capacity = capacity
        self._prefixes: dict[int, _Prefix] = {}
        self._tokens = 0.0  # the shared prefixes' tokens, summed

    def sighted(self, key: int, tokens: float, now: float) -> None:
        """A request whose holders hold ``tokens`` of its prompt, up to the block hashed ``key``, was routed."""
        prefix = self._prefixes.pop(key, None)  # re-inserted below: the dict stays in order of last sighting
        if prefix is None:
            prefix = _Prefix(0, tokens, now)
        prefix.sightings += 1
        prefix.last = now
        if prefix.sightings == self._shares:
            self._tokens += prefix.tokens
        self._prefixes[key] = prefix
        self._expire(now)

    def sightings(self, key: int) -> int:
        """How often ``key`` was sighted since it was last forgotten."""
        prefix = self._prefixes.get(key)
        return 0 if prefix is None else prefix.sightings

    def working_set(self, now: float) -> float:
        """Tokens of the shared prefixes sighted within the window."""
        self._expire(now)
        return self._tokens

    def _expire(self, now: float) -> None:
        prefixes = self._prefixes
        while prefixes:
            key = next(iter(prefixes))
            oldest = prefixes[key]
            if now - oldest.last <= self._window and len(prefixes) <= self._capacity:
                return
            del prefixes[key]
            if oldest.sightings >= self._shares:
                self._tokens = max(0.0, self._tokens - oldest.tokens)
