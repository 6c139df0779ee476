"""Ordering policies for flow-control bands (``orderingPolicyRef``): which request of a flow goes first.

- ``fcfs-ordering-policy`` (default): earliest arrival first.
- ``edf-ordering-policy``: earliest deadline first (deadline = enqueue time + the request's TTL, i.e. the tenant's
  ``requestTTL`` or ``defaultRequestTTL``); requests without a TTL come last, ties go to the earlier arrival.

The header-driven ``slo-deadline-ordering-policy`` is in :mod:`.slo_deadline`.

YAML::

    plugins:
    - type: edf-ordering-policy
    flowControl:
      priorityBands:
      - {priority: 0, orderingPolicyRef: edf-ordering-policy}
"""

from __future__ import annotations

from typing import ClassVar

from epp.flowcontrol.policies import EdfOrdering, FcfsOrdering, OrderingPolicy
from epp.framework.plugins import Handle, NoParams

__all__ = ["FcfsOrderingPolicy", "EdfOrderingPolicy"]


class FcfsOrderingPolicy(FcfsOrdering):
    """First come, first served within a flow (sort key: enqueue time)."""

    type_name: ClassVar[str] = "fcfs-ordering-policy"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params


class EdfOrderingPolicy(EdfOrdering):
    """Earliest deadline first within a flow (sort key: deadline, then enqueue time)."""

    type_name: ClassVar[str] = "edf-ordering-policy"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params


_check_fcfs: type[OrderingPolicy] = FcfsOrderingPolicy
_check_edf: type[OrderingPolicy] = EdfOrderingPolicy
