"""Builders for the parser tests: gRPC frames as a client or server writes them, and a parser built by type."""

from __future__ import annotations

from typing import Any

from epp.framework.plugins import Handle

from .helpers import registry


def frame(message: Any, *, compressed: bool = False) -> bytes:
    """``message`` (a protobuf message, or raw bytes) in one gRPC frame: flag, 4-byte big-endian length, bytes."""
    raw = message if isinstance(message, bytes) else message.SerializeToString()
    return bytes([1 if compressed else 0]) + len(raw).to_bytes(4, "big") + raw


def parser(type_name: str) -> Any:
    """A parser built through the registry, as a config's ``plugins`` entry builds it."""
    return registry().create(type_name, type_name, None, Handle())
