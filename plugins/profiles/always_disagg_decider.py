"""``always-disagg-pd-decider`` (llm-d): every request gets a separate prefill step.

YAML::

    - type: always-disagg-pd-decider
    - type: disagg-profile-handler
      parameters:
        deciders: {prefill: always-disagg-pd-decider}
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, NoParams, PdDecider
from epp.framework.request import InferenceRequest

__all__ = ["AlwaysDisaggPdDecider"]


class AlwaysDisaggPdDecider:
    """Always answers "disaggregate"."""

    type_name: ClassVar[str] = "always-disagg-pd-decider"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def disaggregate(self, cycle: CycleState, request: InferenceRequest, decode_endpoint: Endpoint) -> bool:
        return True


_check: type[PdDecider] = AlwaysDisaggPdDecider
