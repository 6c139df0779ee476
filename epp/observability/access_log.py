"""The access log: one JSON object per request at INFO on the ``epp.access`` logger, through the process's logging
(``epp serve`` sends it to stderr, as text or zap-style JSON lines).

A routed request's line (:meth:`AccessLog.request`) carries its id, tenant (fairness id), model and target model,
the endpoint(s) chosen and the primary profile's best scores (why), status, TTFT, tokens and duration. A request
EPP refused itself (400 bad body, 404 unknown model, 413, 429/503 from flow control, 5xx) gets a line from
:meth:`AccessLog.refusal` with its error code, at INFO for a 4xx and WARNING for a 5xx. Refusal lines are bounded
by a token bucket (:data:`REFUSALS_PER_SECOND`, :data:`REFUSAL_BURST`): a client can make EPP refuse requests
far faster than it makes it route them, and each line costs EPP a write; the next line written says how many were
left out (``suppressed``). Routed requests are never left out: each one costs a model server call already.
The record's message is the object's JSON text; the same dict is the record's ``fields`` attribute.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import orjson

__all__ = ["AccessLog", "REFUSALS_PER_SECOND", "REFUSAL_BURST", "LOGGER"]

LOGGER = "epp.access"
REFUSALS_PER_SECOND = 50.0
"""Refusal lines written per second, at most, on average."""
REFUSAL_BURST = 100
"""Refusal lines written at once after a quiet spell, at most."""


class AccessLog:
    """Writes access lines to ``logger``; refusal lines through a token bucket (``clock`` in seconds)."""

    def __init__(self, logger: logging.Logger | None = None, *, rate: float = REFUSALS_PER_SECOND,
                 burst: int = REFUSAL_BURST, clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger or logging.getLogger(LOGGER)
        self.rate = rate
        self.burst = float(burst)
        self.clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self.suppressed = 0
        """Refusal lines left out since the last one written."""

    def request(self, fields: dict[str, Any]) -> None:
        """Log a routed request's line at INFO."""
        self._emit(logging.INFO, fields)

    def refusal(self, fields: dict[str, Any], status: int) -> None:
        """Log a refused request's line (WARNING for a 5xx ``status``, else INFO), unless the bucket is empty."""
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1.0:
            self.suppressed += 1
            return
        self._tokens -= 1.0
        if self.suppressed:
            fields["suppressed"] = self.suppressed
            self.suppressed = 0
        self._emit(logging.WARNING if status >= 500 else logging.INFO, fields)

    def _emit(self, level: int, fields: dict[str, Any]) -> None:
        logger = self.logger
        if logger.isEnabledFor(level):
            logger.log(level, orjson.dumps(fields).decode(), extra={"fields": fields})
