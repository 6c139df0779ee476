"""How an Envoy bootstrap writes the values its sections share: durations, socket addresses, typed configs.

Pure functions of plain values returning the dict (or string) shapes Envoy's v3 API takes, as YAML/JSON would hold
them; an address that is not ``host:port`` raises :class:`~epp.envoy.options.EnvoyConfigError`.
"""

from __future__ import annotations

from typing import Any

from epp.envoy.options import parse_hostport

__all__ = ["duration", "socket_address", "typed"]


def duration(seconds: float) -> str:
    """A protobuf ``Duration`` as Envoy reads it in YAML: ``"1.5s"``."""
    return f"{seconds:g}s"


def socket_address(value: str) -> dict[str, Any]:
    """An ``Address`` for ``host:port`` (or ``[v6]:port``)."""
    host, port = parse_hostport(value)
    return {"socket_address": {"address": host, "port_value": port}}


def typed(name: str, type_name: str, **config: Any) -> dict[str, Any]:
    """A named extension with its ``typed_config`` of type ``type_name`` (without ``type.googleapis.com/``)."""
    return {"name": name, "typed_config": {"@type": f"type.googleapis.com/{type_name}", **config}}
