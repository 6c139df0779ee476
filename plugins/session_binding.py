"""Shared parts of the session-affinity plugins (llm-d-router ``scheduling/util/sessionaffinity``).

- The encoded-endpoint token: ``base64("<namespace>/<name>")`` of an endpoint, which the client echoes back.
- :class:`SessionBindings`: the server-side store behind the stateful algorithms (``session_id_header`` of
  ``session-affinity-scorer``, ``session_id`` of ``session-affinity-filter``). It maps an opaque session identifier
  to the endpoint (``<namespace>/<name>``) that served it, counts the sessions bound to each endpoint, and drops
  a binding unused for longer than the TTL. The reference sweeps on a timer goroutine; EPP sweeps on the event
  loop when a request touches the store and ``sweep`` seconds have passed since the last sweep, which drops the
  same bindings without a background task. Bindings change only after a pick (PreRequest), never while scoring.
- :func:`picked_endpoint`: the endpoint one profile of a scheduling result chose (``profileName``, or the primary).

Each plugin instance owns its store: a filter and a scorer with stateful algorithms keep independent bindings, as
in the reference.
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import SchedulingResult

__all__ = ["DEFAULT_TOKEN_HEADER", "session_id", "session_token", "decode_token", "normalize_header",
           "picked_endpoint", "SessionBindings", "header_value"]

DEFAULT_TOKEN_HEADER = "x-session-token"


def session_id(endpoint: Endpoint) -> str:
    """``<namespace>/<name>``: what the token carries (Go ``types.NamespacedName.String()``)."""
    return f"{endpoint.spec.namespace}/{endpoint.name}"


def session_token(endpoint: Endpoint) -> str:
    """The token that routes a session back to ``endpoint``: standard base64 of :func:`session_id`."""
    return base64.b64encode(session_id(endpoint).encode()).decode()


def decode_token(token: str | None) -> str | None:
    """The ``<namespace>/<name>`` a token names, or None for no token or one that is not base64 text."""
    if not token:
        return None
    try:
        return base64.b64decode(token, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def normalize_header(name: str | None, default: str = DEFAULT_TOKEN_HEADER) -> str:
    """The configured header name lower-cased and trimmed (request headers are lower-cased); ``default`` if empty."""
    header = (name or "").strip().lower()
    return header or default


def header_value(headers: Mapping[str, str], name: str) -> str:
    """The trimmed value of header ``name`` (already lower-case), or ""."""
    return (headers.get(name) or "").strip()


def picked_endpoint(result: SchedulingResult, profile_name: str | None) -> Endpoint | None:
    """The first endpoint chosen by profile ``profile_name`` (empty: the primary profile), or None."""
    res = result.profile_results.get(profile_name or result.primary_profile)
    return res.endpoints[0] if res is not None and res.endpoints else None


@dataclass(slots=True)
class _Binding:
    endpoint: str
    last_seen: float
    misses: int = 0


class SessionBindings:
    """Session identifier -> bound endpoint id, with per-endpoint session counts and TTL eviction.

    Not thread-safe: use it from the event loop only (scheduling and PreRequest hooks run there).
    """

    def __init__(self, ttl: float, sweep: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.sweep_interval, self._clock = ttl, sweep, clock
        self._bindings: dict[str, _Binding] = {}
        self._counts: dict[str, int] = {}
        self._last_sweep = clock()

    def __len__(self) -> int:
        return len(self._bindings)

    def bound(self, session: str) -> str | None:
        """The endpoint id ``session`` is bound to, or None (expired bindings go at the next sweep)."""
        self._maybe_sweep()
        b = self._bindings.get(session)
        return b.endpoint if b is not None else None

    def count(self, endpoint_id: str) -> int:
        """Sessions currently bound to ``endpoint_id``."""
        return self._counts.get(endpoint_id, 0)

    def least_bound(self, endpoints: list[Endpoint]) -> Endpoint:
        """The candidate bound by the fewest sessions; the first such in candidate order on a tie."""
        return min(endpoints, key=lambda ep: self.count(session_id(ep)))

    def bind(self, session: str, endpoint_id: str) -> None:
        """Bind (or re-bind) ``session`` to ``endpoint_id`` and refresh it; counts follow the move."""
        self._maybe_sweep()
        old = self._bindings.get(session)
        if old is not None and old.endpoint == endpoint_id:
            old.last_seen, old.misses = self._clock(), 0
            return
        if old is not None:
            self._decrement(old.endpoint)
        self._bindings[session] = _Binding(endpoint_id, self._clock())
        self._counts[endpoint_id] = self.count(endpoint_id) + 1

    def refresh(self, session: str) -> None:
        """Mark ``session``'s binding used now and its endpoint seen (the miss count restarts)."""
        b = self._bindings.get(session)
        if b is not None:
            b.last_seen, b.misses = self._clock(), 0

    def miss(self, session: str) -> int:
        """Count one more consecutive request without ``session``'s endpoint among the candidates; the count."""
        b = self._bindings.get(session)
        if b is None:
            return 0
        b.misses += 1
        return b.misses

    def _decrement(self, endpoint_id: str) -> None:
        left = self.count(endpoint_id) - 1
        if left > 0:
            self._counts[endpoint_id] = left
        else:
            self._counts.pop(endpoint_id, None)

    def _maybe_sweep(self) -> None:
        now = self._clock()
        if now - self._last_sweep < self.sweep_interval:
            return
        self._last_sweep = now
        for session, b in list(self._bindings.items()):
            if now - b.last_seen > self.ttl:
                del self._bindings[session]
                self._decrement(b.endpoint)
