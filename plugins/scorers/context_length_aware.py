"""``context-length-aware``: routes requests to endpoints labelled for their context length.

Each endpoint may carry the label ``label`` (default ``llm-d.ai/context-length-range``) with one inclusive range
``"<min>-<max>"``. The request length ``L`` is its prompt's UTF-8 bytes // 4 (string contents only). Scorer
(always on; ``w = max - min``)::

    no label                      0.5
    unparsable label              0.0
    min <= L <= max, w == 0       1.0
    min <= L <= max               0.3 + 0.7 * (0.7 / (1 + w / 10000) + 0.3 * (max - L) / w)     # in (0.3, 1]
    out of range, d = distance to the nearer bound
                                  0.3 / (1 + d / 1000)                                           # in (0, 0.3)

Filter (only with ``enableFiltering: true``): keeps endpoints without the label and those whose range holds ``L``;
it may leave none (the profile fails). Listed in a profile, the plugin acts as both filter and scorer.

YAML::

    - type: context-length-aware
      parameters:
        label: llm-d.ai/context-length-range
        enableFiltering: false
"""

from __future__ import annotations

import logging
import re
from typing import Any, ClassVar

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Filter, Handle, Scorer
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import CHARS_PER_TOKEN, ApiKind, InferenceRequest, utf8_len

__all__ = ["ContextLengthAware", "DEFAULT_LABEL", "parse_range", "range_score", "context_length"]

log = logging.getLogger("epp.plugins.context_length_aware")

DEFAULT_LABEL = "llm-d.ai/context-length-range"

_GO_SPACE = " \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
            "\u2028\u2029\u202f\u205f\u3000"
"""What Go's ``strings.TrimSpace`` removes (``unicode.IsSpace``)."""
_ATOI = re.compile(r"[+-]?[0-9]+")
_INT64 = (-(1 << 63), (1 << 63) - 1)
_MAX_FALLBACK = 0.3


def _atoi(text: str) -> int | None:
    """Go's ``strconv.Atoi`` on a ``TrimSpace``-d string: optional sign, ASCII digits, int64 range; else None."""
    text = text.strip(_GO_SPACE)
    if not _ATOI.fullmatch(text):
        return None
    value = int(text)
    return value if _INT64[0] <= value <= _INT64[1] else None


def parse_range(label: str) -> tuple[int, int] | None:
    """``"min-max"`` as ``(min, max)``, or None when the label is not one valid range."""
    bounds = label.split("-")
    if len(bounds) != 2:
        return None
    lo, hi = _atoi(bounds[0]), _atoi(bounds[1])
    if lo is None or hi is None or lo > hi:
        return None
    return lo, hi


def range_score(length: int, lo: int, hi: int) -> float:
    """llm-d's ``calculateRangeScore``: (0.3, 1] inside the range, (0, 0.3) outside by distance."""
    if lo <= length <= hi:
        width = hi - lo
        if width == 0:
            return 1.0
        raw = 0.7 * (1.0 / (1.0 + width / 10000.0)) + 0.3 * ((hi - length) / width)
        return _MAX_FALLBACK + raw * (1.0 - _MAX_FALLBACK)
    distance = length - hi if length > hi else lo - length
    return _MAX_FALLBACK / (1.0 + distance / 1000.0)


def context_length(request: InferenceRequest) -> int:
    """llm-d's ``estimateContextLength``: string contents (chat) or a string prompt (completions), bytes // 4."""
    body: dict[str, Any] = request.body
    total = 0
    if request.api is ApiKind.CHAT_COMPLETIONS:
        messages = body.get("messages")
        for msg in messages if isinstance(messages, list) else ():
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, str):
                total += utf8_len(content)
    elif request.api is ApiKind.COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            total = utf8_len(prompt)
    return total // CHARS_PER_TOKEN


class ContextLengthAware:
    """Scores endpoints by how well their context-length range fits the request; filters when enabled."""

    type_name: ClassVar[str] = "context-length-aware"

    class Params(PluginParams):
        label: str = Field(DEFAULT_LABEL, min_length=1)
        enable_filtering: bool = Field(False, alias="enableFiltering")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._label = params.label
        self._filtering = params.enable_filtering
        self._reported: set[str] = set()

    def _range(self, value: str) -> tuple[int, int] | None:
        parsed = parse_range(value)
        if parsed is None and value not in self._reported:
            self._reported.add(value)  # once per distinct value: llm-d logs it on every request
            log.warning("%s: endpoint label %s=%r is not a 'min-max' range", self.name, self._label, value)
        return parsed

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        if not self._filtering:
            return endpoints
        length = context_length(request)
        out: list[Endpoint] = []
        for ep in endpoints:
            value = ep.labels.get(self._label)
            if value is None:
                out.append(ep)
                continue
            bounds = self._range(value)
            if bounds is not None and bounds[0] <= length <= bounds[1]:
                out.append(ep)
        return out

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        length = context_length(request)
        scores: list[float] = []
        for ep in endpoints:
            value = ep.labels.get(self._label)
            if value is None:
                scores.append(0.5)
                continue
            bounds = self._range(value)
            scores.append(0.0 if bounds is None else range_score(length, *bounds))
        return scores


_check: type[Scorer] = ContextLengthAware
_check_filter: type[Filter] = ContextLengthAware
