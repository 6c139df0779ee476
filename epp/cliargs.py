"""Argument types shared by the ``epp`` sub-commands: each parses one option's text or raises
``argparse.ArgumentTypeError``, which argparse reports as a usage error naming the option (exit code 2)."""

from __future__ import annotations

import argparse

__all__ = ["listen_port_arg", "port_arg", "positive_arg"]


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


def _int_arg(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
