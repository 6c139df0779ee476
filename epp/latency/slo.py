"""The request's SLO headers in milliseconds, read as the reference reads them (Go's ``strconv.ParseFloat``), for
``predicted-latency-producer`` and ``latency-slo-admitter`` alike."""

from __future__ import annotations

import re
from typing import Mapping

from epp.headers import header_value

__all__ = ["go_parse_float", "slo_header_ms"]

_D = r"[0-9](?:_?[0-9])*"
_H = r"[0-9a-fA-F](?:_?[0-9a-fA-F])*"
_GO_DECIMAL = re.compile(rf"[+-]?(?:{_D}(?:\.(?:{_D})?)?|\.{_D})(?:[eE][+-]?{_D})?")
_GO_HEX = re.compile(rf"[+-]?0[xX](?:_?{_H}(?:\.(?:{_H})?)?|\.{_H})[pP][+-]?{_D}")
_GO_INF = re.compile(r"[+-]?inf(?:inity)?", re.IGNORECASE)
"""What Go's ``strconv.ParseFloat`` accepts (the Go float literal syntax, underscores between digits, no spaces),
apart from NaN, which is never > 0."""


def go_parse_float(text: str) -> float | None:
    """``text`` as Go's ``strconv.ParseFloat(text, 64)`` reads it; None where Go returns an error (bad syntax, or
    a finite literal too large for a float64)."""
    try:
        if _GO_INF.fullmatch(text):
            return float(text)
        if _GO_DECIMAL.fullmatch(text):
            value = float(text.replace("_", ""))
        elif _GO_HEX.fullmatch(text):
            value = float.fromhex(text.replace("_", ""))
        else:
            return None
    except OverflowError:
        return None
    return value if abs(value) != float("inf") else None


def slo_header_ms(headers: Mapping[str, str], name: str) -> float:
    """The SLO header ``name`` (else its deprecated alias) in milliseconds; 0 when absent, empty or unparsable, as
    the reference's ``parseFloatHeaderValue``."""
    value = header_value(headers, name)
    parsed = go_parse_float(value) if value else None
    return parsed if parsed is not None else 0.0
