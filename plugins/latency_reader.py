"""What the readers of ``predicted-latency-producer``'s predictions share: the parameter naming the producer.

``latency-scorer``, ``slo-headroom-tier-filter`` and ``latency-slo-admitter`` take
``latencyPredictionInfoProducerName`` (as llm-d-router's do): it must name a configured ``predicted-latency-producer``
(the reference fails at start-up when no plugin produces the named prediction). Unset, a reader reads whatever
producer the config declares or EPP creates automatically. The predictions themselves are read with
:func:`epp.latency.predictions_of`: one producer's per cycle (see ``docs/latency.md``, "The readers").
"""

from __future__ import annotations

from typing import Any

from epp.errors import ConfigError
from epp.framework.plugins import Handle
from epp.latency import PRODUCER_TYPE

__all__ = ["LATENCY_PRODUCER_NAME_FIELD", "check_latency_producer_name"]

LATENCY_PRODUCER_NAME_FIELD = "latencyPredictionInfoProducerName"


def check_latency_producer_name(owner: Any, handle: Handle, name: str | None) -> None:
    """A reader's ``latencyPredictionInfoProducerName`` (None or "": not set, nothing to check) must name a configured
    ``predicted-latency-producer``; ``ConfigError`` naming ``owner`` (its ``name``/``type_name``) and the field
    otherwise. Call it from the reader's ``bind``."""
    if not name:
        return
    named = handle.plugin(name)
    if named is not None and named.type_name == PRODUCER_TYPE:
        return
    what = "is not configured" if named is None else f"is a {named.type_name}, not a {PRODUCER_TYPE}"
    raise ConfigError(f"plugin '{owner.name}' (type: {owner.type_name}): {LATENCY_PRODUCER_NAME_FIELD} names plugin "
                      f"'{name}', which {what}", plugin=owner.name, field=LATENCY_PRODUCER_NAME_FIELD)
