"""Argument types shared by the ``epp`` sub-commands: each parses one option's text or raises
``argparse.ArgumentTypeError``, which argparse reports as a usage error naming the option (exit code 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from epp.config.units import parse_binary_size, parse_flag_duration

__all__ = ["byte_size_arg", "duration_arg", "listen_port_arg", "nonnegative_arg", "port_arg", "positive_arg",
           "positive_duration_arg", "ranged_arg"]

_N = TypeVar("_N", int, float)


def ranged_arg(kind: Callable[[str], _N], low: _N, high: _N, what: str) -> Callable[[str], _N]:
    """An argparse type: the text parsed by ``kind`` (``int`` or ``float``) and within [low, high]; the error names
    ``what`` when the text does not parse, and the range when the value is outside it."""

    def parse(text: str) -> _N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r} (from {low} to {high})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range ({low} to {high})")
        return value

    return parse


def port_arg(text: str) -> int:
    """An argparse type for a port option: 0–65535 (0 picks a free port) or -1 (the listener is off)."""
    value = _int_arg(text, "a port number")
    if not -1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range (0-65535, or -1 to turn it off)")
    return value


def listen_port_arg(text: str) -> int:
    """An argparse type for a port that cannot be turned off: 0–65535 (0 picks a free port)."""
    value = _int_arg(text, "a port number")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range (0-65535)")
    return value


def positive_arg(text: str) -> int:
    """An argparse type for a count or size that must be at least 1."""
    value = _int_arg(text, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def nonnegative_arg(text: str) -> int:
    """An argparse type for a count where 0 means "no limit"."""
    value = _int_arg(text, "a whole number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def byte_size_arg(text: str) -> int:
    """An argparse type for a size in bytes, at least 1: a number, or one with ``KiB`` or ``MiB`` (``k``, ``M``
    and ``KB``, ``MB`` read as the same powers of two), e.g. ``65536``, ``64KiB``, ``1M``."""
    try:
        return parse_binary_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration_arg(text: str) -> float:
    """An argparse type for a duration, in seconds: a Go duration as the reference's flags take (``50ms``, ``1s``,
    ``1m30s``) or a plain number of seconds (``0.05``)."""
    try:
        return parse_flag_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_duration_arg(text: str) -> float:
    """:func:`duration_arg` that must be more than zero."""
    value = duration_arg(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than zero, got {text!r}")
    return value


def _int_arg(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
