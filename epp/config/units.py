"""Byte sizes written as Kubernetes quantities, read as the reference EPP reads its ``--grpc-max-*-msg-size``
flags (``pkg/epp/server/options.go``): ``sanitizeSizeString``, then apimachinery's ``resource.ParseQuantity``,
then ``Quantity.AsInt64``.

Contracts of :func:`parse_size_flag`, which follow those three steps:

- one trailing ``B`` or ``b`` is dropped (``10MiB`` -> ``10Mi``, ``25MB`` -> ``25M``, decimal mega), after
  surrounding whitespace; a lone ``B`` stays and is refused;
- the rest is ``[+-]<digits>[.<digits>]<suffix>`` with a suffix of ``Ki Mi Gi Ti Pi Ei`` (powers of 1024), ``n u m
  k M G T P E`` or none (powers of 1000), or ``e``/``E`` and an exponent. Anything else is refused with
  apimachinery's error text;
- ``AsInt64`` succeeds only for values ParseQuantity keeps as a scaled int64 that is whole: a fraction (``1.5``,
  ``500m``), a binary suffix with a fraction (``0.5Mi``), more digits than its fast path takes (``1Ei``, 19 digits)
  or more than ``2**63 - 1`` all fail it, which the reference reports as "overflows maximum supported size";
- a negative value is refused, as the reference's ``Complete`` does.
"""

from __future__ import annotations

import re

__all__ = ["parse_size_flag", "FORMAT_ERROR", "SUFFIX_ERROR"]

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


def parse_size_flag(flag: str, text: str) -> int:
    """Bytes from ``text`` as the reference reads flag ``flag`` (e.g. ``grpc-max-recv-msg-size``); ``ValueError``
    with the reference's messages for a malformed value, a value that is no whole int64, or a negative one."""
    s = _sanitize(text)
    match = _SCAN.fullmatch(s)
    if not s or match is None:
        raise ValueError(f"invalid {flag}: {FORMAT_ERROR}")
    sign, num, denom, suffix = match.groups()
    parsed = _suffix(suffix)
    if parsed is None:
        raise ValueError(f"invalid {flag}: {SUFFIX_ERROR}")
    magnitude = _as_int64(num or "0", denom or "", *parsed)
    if magnitude is None:
        raise ValueError(f"{flag} overflows maximum supported size: {s}")
    value = -magnitude if sign == "-" else magnitude
    if value < 0:
        raise ValueError(f"{flag} must be non-negative, got {value}")
    return value
