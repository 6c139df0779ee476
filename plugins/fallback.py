"""Parameter values the reference replaces by its default instead of refusing, and EPP does the same.

llm-d's factories fall back to the default for some out-of-range values (``maxNumOfEndpoints <= 0`` in the three
pickers, ``threshold <= 0`` in ``load-aware-scorer``, ``maxBusyScore`` outside [0, 1] in
``active-request-scorer``, ...). A config that loads there must load here with the same behaviour, so these
values are corrected too, with one warning that names the plugin and the field. Values the reference refuses
stay configuration errors.
"""

from __future__ import annotations

import logging
from typing import TypeVar

__all__ = ["fall_back"]

log = logging.getLogger("epp.plugins")

T = TypeVar("T", int, float)


def fall_back(plugin: object, field: str, value: T, default: T, valid: bool) -> T:
    """``value`` when ``valid``; else ``default``, after one warning naming the plugin, the field and both values.

    ``plugin`` needs ``name`` and ``type_name``; ``field`` is the YAML parameter name.
    """
    if valid:
        return value
    log.warning("plugin '%s' (type: %s): %s %r is out of range; using the default %r, as the reference does",
                getattr(plugin, "name", "?"), getattr(plugin, "type_name", "?"), field, value, default)
    return default
