"""``featureGates``: the known gates, their defaults, and the one answer to "is gate X on".

Each entry is ``name``, ``name=true`` or ``name=false`` (a bare name means true; the value is read as Go's
``strconv.ParseBool`` reads it); anything else, or a name that is not registered, is an error. Entries apply in
order, so the last one for a gate wins; a gate no entry names takes its registered default. Registered gates:
``flowControl`` (off: the flow-control layer, :mod:`epp.flowcontrol`), ``haPopulateNonLeaderDatastore`` (on;
EPP's standbys always keep their datastore, so ``=false`` changes nothing), and ``dataLayer`` and
``enableLegacyMetrics`` (off; gates of older reference releases, accepted so their configs load).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Mapping

__all__ = ["GATE_DEFAULTS", "FeatureGateError", "parse_feature_gates", "enabled_gates"]

GATE_DEFAULTS: Mapping[str, bool] = MappingProxyType({
    "dataLayer": False,
    "enableLegacyMetrics": False,
    "flowControl": False,
    "haPopulateNonLeaderDatastore": True,
})
"""Every gate EPP knows, with the value it has when no ``featureGates`` entry names it."""

_TRUE = frozenset({"1", "t", "true"})
_FALSE = frozenset({"0", "f", "false"})


class FeatureGateError(ValueError):
    """A ``featureGates`` entry names an unknown gate or carries a value that is not a boolean."""


def _parse_entry(entry: str) -> tuple[str, bool]:
    """One entry as ``(name, value)``; raises :class:`FeatureGateError` with the reference's wording."""
    parts = entry.split("=")
    name = parts[0]
    if name not in GATE_DEFAULTS:
        known = ", ".join(sorted(GATE_DEFAULTS))
        raise FeatureGateError(f"feature gate '{name}' is unknown or unregistered (known: {known})")
    if len(parts) == 1:
        return name, True
    text = parts[1].strip().lower()
    if text in _TRUE or text in _FALSE:
        return name, text in _TRUE
    raise FeatureGateError(f"{parts[1]} is not a valid value for the feature gate {name} "
                           f"(expected true or false)")


def parse_feature_gates(entries: Iterable[str]) -> dict[str, bool]:
    """Every registered gate's value under ``entries``: the defaults, overridden in order by each entry."""
    values = dict(GATE_DEFAULTS)
    for entry in entries:
        name, value = _parse_entry(entry)
        values[name] = value
    return values


def enabled_gates(entries: Iterable[str]) -> frozenset[str]:
    """The names of the gates that are on under ``entries`` (defaults included)."""
    return frozenset(name for name, on in parse_feature_gates(entries).items() if on)
