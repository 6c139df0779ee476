"""EPP's built-in plugins, one per module, grouped by role.

:func:`register_builtin` is the one place the built-ins are registered (each sub-package lists its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epp.framework.registry import Registry

__all__ = ["register_builtin"]


def register_builtin(registry: Registry) -> None:
    """Register every built-in plugin type (and deprecated alias) in ``registry``."""
    from . import (datalayer, filters, flowcontrol, parsers, pickers, producers, profiles, requestcontrol, saturation,
                   scorers)

    for group in (filters, scorers, pickers, profiles, producers, parsers, saturation, datalayer, flowcontrol,
                  requestcontrol):
        group.register(registry)
