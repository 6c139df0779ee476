"""Homes for shared prompt prefixes: the ttft-cost-scorer's ``prefixHomes`` registry.

A prefix is keyed by its first block's hash. The first request of a prefix only records where it went; the second
one gives the prefix a home, the endpoint that is home to the fewest prefixes (the first one's endpoint on a tie),
and the scorer keeps that request there. So prompts that are never repeated get no home, and prefixes that are (an
app's system prompt) start out one per endpoint, the way a cache-aware router's smallest-tree rule spreads them;
from then on the prefix goes wherever its holders' costs send it. Both tables are bounded (oldest first out) and
per process: ``--workers`` each keep their own. Measurements: docs/routing.md.
"""

from __future__ import annotations

MAX_PREFIXES = 16_384
"""Prefixes remembered at most in each table: a stream of unrelated prompts pushes out the oldest, not memory."""


class PrefixHomes:
    """First sightings and homes by first-block hash, with each endpoint's count of homes."""

    def __init__(self, capacity: int = MAX_PREFIXES) -> None:
        self._capacity = capacity
        self._first: dict[int, str] = {}   # seen once: where its first request went
        self._homes: dict[int, str] = {}
        self._count: dict[str, int] = {}   # homes per endpoint name

    def seen(self, key: int, endpoint: str) -> None:
        """A request of prefix ``key`` went to ``endpoint`` (only the first one is kept)."""
        if key in self._first or key in self._homes:
            return
        if len(self._first) >= self._capacity:
            del self._first[next(iter(self._first))]
        self._first[key] = endpoint

    def home(self, key: int, candidates: list[str]) -> tuple[str | None, bool]:
        """The home of prefix ``key`` among ``candidates`` and whether it was given just now; ``(None, False)``
        for a prefix seen never or whose home is not a candidate (filtered out or gone)."""
        home = self._homes.get(key)
        if home is not None:
            return (home, False) if home in candidates else (None, False)
        if not candidates or key not in self._first:
            return None, False
        first = self._first.pop(key)
        count = self._count
        home = min(candidates, key=lambda name: (count.get(name, 0), name != first))
        if len(self._homes) >= self._capacity:
            self._forget(next(iter(self._homes)))
        self._homes[key] = home
        count[home] = count.get(home, 0) + 1
        return home, True

    def remove_endpoint(self, name: str) -> None:
        """``name`` is gone: its prefixes lose their home and get a new one at their next request."""
        for key in [k for k, home in self._homes.items() if home == name]:
            self._forget(key)
            self.seen(key, name)  # seen before: its next request gives it a home among the live endpoints
        self._count.pop(name, None)

    def _forget(self, key: int) -> None:
        home = self._homes.pop(key)
        self._count[home] -= 1

    def __len__(self) -> int:
        return len(self._homes)
