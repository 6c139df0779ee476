"""Units written in configuration and flags, parsed in one place: Go durations, Kubernetes quantities, byte sizes.

- :func:`parse_duration`: seconds from a Go duration (``"30s"``, ``"1m30s"``, ``"200ms"``, ``"0"``) or a number;
  :func:`parse_flag_duration` also takes a plain number of seconds as text (``"0.05"``), as EPP's flags do.
- :func:`parse_quantity`: a whole number from a Kubernetes quantity (``100``, ``"2k"``, ``"1.5Gi"``, ``"1e3"``,
  ``"500m"``), rounded up, as apimachinery's ``Quantity.Value()``.
- :func:`parse_size_flag`: bytes as the reference reads its ``--grpc-max-*-msg-size`` flags: one trailing ``B``
  dropped, apimachinery's ``ParseQuantity``, then ``AsInt64``, which refuses fractions, values past its int64 fast
  path (``1Ei``) and more than ``2**63 - 1``; errors carry apimachinery's texts.
- :func:`parse_binary_size`: EPP's own ``--http-*`` sizes: bytes, ``KiB`` or ``MiB`` (``k``/``KB``, ``M``/``MB``
  read as the same powers of two).

:data:`Duration` and :data:`Quantity` are the pydantic field types. Every parser raises ``ValueError``; none accepts
a negative value.
"""

from __future__ import annotations

import math
import re
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, Context, Decimal
from typing import Annotated, Any

from pydantic import BeforeValidator

__all__ = ["parse_duration", "parse_flag_duration", "parse_quantity", "parse_size_flag", "parse_binary_size",
           "Duration", "Quantity", "FORMAT_ERROR", "SUFFIX_ERROR"]

# -- Go durations ---------------------------------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_SECONDS = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def parse_duration(value: Any) -> float:
    """Seconds from a Go duration string (``"30s"``, ``"1m30s"``, ``"200ms"``, ``"0"``) or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a string like '30s' or a number of seconds")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _duration_text(value.strip())
    else:
        raise ValueError("a duration must be a string like '30s' or a number of seconds")
    if seconds < 0:
        raise ValueError(f"duration {value!r} is negative")
    return seconds


def _duration_text(text: str) -> float:
    if text == "0":
        return 0.0
    if not text:
        raise ValueError("empty duration")
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            raise ValueError(f"invalid duration {text!r} (expected e.g. '30s', '200ms', '1m30s')")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    return total


def parse_flag_duration(text: str) -> float:
    """Seconds from a flag's text: a Go duration as the reference's flags take (``50ms``, ``1m30s``) or a plain
    number of seconds (``0.05``)."""
    text = text.strip()
    if _SECONDS.fullmatch(text):
        return float(text)
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ValueError(f"{exc}; or a number of seconds") from None


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds, written in YAML as a Go duration string or a number."""

# -- Kubernetes quantities ------------------------------------------------------------------------------------------

_SPLIT_RE = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
FORMAT_ERROR = f"quantities must match the regular expression '{_SPLIT_RE}'"
"""apimachinery's ``ErrFormatWrong`` text."""
SUFFIX_ERROR = "unable to parse quantity's suffix"
"""apimachinery's ``ErrSuffix`` text."""

# ParseQuantity's scanner: sign, leading zeros, whole digits, an optional fraction, then the suffix characters, an
# optional sign and digits. A leading "." or an empty number is zero, as there.
_SCAN = re.compile(r"([+-]?)0*(\d*)(?:\.(\d*))?([eEinumkKMGTP]*[+-]?\d*)")
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_INT64_MAX = 2**63 - 1
_MAX_INT64_FACTORS = 18  # apimachinery's maxInt64Factors: digits an int64 always holds


def _sanitize(text: str) -> str:
    """The reference's ``sanitizeSizeString``."""
    text = text.strip()
    return text[:-1] if len(text) > 1 and text[-1] in "Bb" else text


def _suffix(suffix: str) -> tuple[int, int] | None:
    """(base, exponent) of a quantity suffix, or None if it is none apimachinery knows. A decimal exponent is read
    as a 64-bit integer and kept as a 32-bit one, as there."""
    if suffix in _DECIMAL:
        return 10, _DECIMAL[suffix]
    if suffix in _BINARY:
        return 2, _BINARY[suffix]
    if len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[+-]?\d+", suffix[1:]):
        exponent = int(suffix[1:])
        if -(2**63) <= exponent <= _INT64_MAX:
            return 10, (exponent + 2**31) % 2**32 - 2**31
    return None


def _as_int64(num: str, denom: str, base: int, exponent: int) -> int | None:
    """The magnitude ParseQuantity's int64 fast path gives and ``AsInt64`` converts, or None where either gives
    up (the slow, inf.Dec form is never converted)."""
    if base == 2:
        if denom or 15 - len(num) - int(exponent * 3 / 10) - 1 < 0:
            return None
        value = int(num) << exponent
    else:
        scale = exponent - len(denom)
        if _MAX_INT64_FACTORS - len(num) - len(denom) < 0 or scale < 0:
            return None  # below nano the slow form; a negative scale AsInt64 refuses
        value = int(num + denom)
        if value and scale > _MAX_INT64_FACTORS:
            return None
        value *= 10 ** scale if value else 1
    return value if value <= _INT64_MAX else None


def _scan(text: str) -> tuple[re.Match[str], int, int]:
    """ParseQuantity's reading of ``text``: the scanner's match and the suffix's (base, exponent); ``ValueError``
    with apimachinery's text when either is malformed."""
    match = _SCAN.fullmatch(text)
    if not text or match is None:
        raise ValueError(FORMAT_ERROR)
    parsed = _suffix(match.group(4))
    if parsed is None:
        raise ValueError(SUFFIX_ERROR)
    return match, *parsed


def parse_size_flag(flag: str, text: str) -> int:
    """Bytes from ``text`` as the reference reads flag ``flag`` (e.g. ``grpc-max-recv-msg-size``); ``ValueError``
    with the reference's messages for a malformed value, a value that is no whole int64, or a negative one."""
    s = _sanitize(text)
    try:
        match, base, exponent = _scan(s)
    except ValueError as exc:
        raise ValueError(f"invalid {flag}: {exc}") from None
    sign, num, denom, _ = match.groups()
    magnitude = _as_int64(num or "0", denom or "", base, exponent)
    if magnitude is None:
        raise ValueError(f"{flag} overflows maximum supported size: {s}")
    value = -magnitude if sign == "-" else magnitude
    if value < 0:
        raise ValueError(f"{flag} must be non-negative, got {value}")
    return value


_QUANTITY_CONTEXT = Context(prec=80, Emax=MAX_EMAX, Emin=MIN_EMIN)  # any 32-bit exponent apimachinery keeps
_QUANTITY_HINT = "expected a number or a string like '100', '2k', '1Gi'"


def parse_quantity(value: Any) -> int:
    """A non-negative whole number from a Kubernetes quantity, as the reference's ``resource.Quantity.Value()``:
    a number or a string (``100``, ``"2k"``, ``"1.5Gi"``, ``"1e3"``, ``"500m"``), rounded up to an integer."""
    if isinstance(value, bool):
        raise ValueError("a quantity must be a number or a string like '100', '2k' or '1Gi'")
    if isinstance(value, int):
        exact = Decimal(value)
    elif isinstance(value, float) and math.isfinite(value):
        exact = Decimal(repr(value))
    elif isinstance(value, str):
        exact = _quantity_decimal(value)
    else:
        raise ValueError(f"invalid quantity {value!r} ({_QUANTITY_HINT})")
    if exact < 0:
        raise ValueError(f"quantity {value!r} is negative")
    if exact > _INT64_MAX:  # checked before rounding: an exponent such as 1e999999 must not become an int
        raise ValueError(f"quantity {value!r} is too large")
    return int(exact.to_integral_value(rounding=ROUND_CEILING, context=_QUANTITY_CONTEXT))


def _quantity_decimal(text: str) -> Decimal:
    """The exact value of a quantity string; ``ValueError`` unless it is one with at least one digit."""
    s = text.strip()
    try:
        match, base, exponent = _scan(s)
    except ValueError:
        raise ValueError(f"invalid quantity {text!r} ({_QUANTITY_HINT})") from None
    if not any(c.isdigit() for c in s[:match.start(4)]):  # a suffix alone ("k") or ".": no number in it
        raise ValueError(f"invalid quantity {text!r} ({_QUANTITY_HINT})")
    sign, num, denom, _ = match.groups()
    magnitude = Decimal(f"{num or 0}.{denom or ''}")
    if base == 10:
        magnitude = magnitude.scaleb(exponent, context=_QUANTITY_CONTEXT)
    else:
        magnitude = _QUANTITY_CONTEXT.multiply(magnitude, Decimal(2**exponent))
    return -magnitude if sign == "-" else magnitude


Quantity = Annotated[int, BeforeValidator(parse_quantity)]
"""A non-negative count, written in YAML as a number or a Kubernetes quantity (``2k``, ``1Gi``)."""

# -- EPP's own byte sizes -------------------------------------------------------------------------------------------

_BINARY_SIZE = re.compile(r"(\d+)\s*(|k|kb|kib|m|mb|mib)", re.IGNORECASE)
_BINARY_UNITS = {"": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20}


def parse_binary_size(text: str) -> int:
    """A size in bytes, at least 1: a number, or one with ``KiB`` or ``MiB`` (``k`` and ``KB``, ``M`` and ``MB``
    read as the same powers of two), e.g. ``65536``, ``64KiB``, ``1M``."""
    match = _BINARY_SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"expected a size in bytes (e.g. 65536, 64KiB, 1MiB), got {text!r}")
    value = int(match.group(1)) * _BINARY_UNITS[match.group(2).lower()]
    if value < 1:
        raise ValueError(f"must be at least 1 byte, got {text!r}")
    return value
