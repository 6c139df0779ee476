"""The composition root's plugin list: the one module under ``epp`` that imports the built-in plugins.

:data:`BUILTIN_GROUPS` lists the groups of :mod:`epp.plugins` (the reference runner's plugin registration block);
each group registers its own classes with ``register(registry)``. :func:`default_registry` is the registry EPP's
commands hand to the config loader: every built-in type (and deprecated alias), then, unless disabled, the
third-party plugins advertised in the ``epp.plugins`` entry-point group. The engine never imports plugins: it is
given this registry (explicit composition), so a test or an embedding program may pass another.
"""

from __future__ import annotations

from types import ModuleType

from epp.framework.registry import Registry
from epp.plugins import (
    datalayer,
    filters,
    flowcontrol,
    health,
    parsers,
    pickers,
    producers,
    profiles,
    requestcontrol,
    saturation,
    scorers,
)

__all__ = ["BUILTIN_GROUPS", "register_builtins", "default_registry"]

BUILTIN_GROUPS: tuple[ModuleType, ...] = (filters, scorers, pickers, profiles, producers, parsers, saturation,
                                          datalayer, flowcontrol, requestcontrol, health)
"""The built-in plugin groups, in registration order (a type registered twice is an error, whatever the order)."""


def register_builtins(registry: Registry) -> None:
    """Register every built-in plugin type (and deprecated alias) in ``registry``."""
    for group in BUILTIN_GROUPS:
        group.register(registry)


def default_registry(*, entry_points: bool = True) -> Registry:
    """A registry with every built-in plugin and (unless disabled) the third-party entry points."""
    registry = Registry()
    register_builtins(registry)
    if entry_points:
        registry.load_entry_points()
    return registry
