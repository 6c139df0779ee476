"""``by-label`` (llm-d, deprecated): keeps endpoints whose value of one label is in a list.

Semantics: an endpoint with the label passes if its value is in ``validValues``; one without it passes only if
``allowsNoLabel``. ``label`` must be non-empty, and an empty ``validValues`` needs ``allowsNoLabel: true``.
The role filters (``decode-filter``, ``prefill-filter``, ``encode-filter``) are fixed instances of this rule on
the ``llm-d.ai/role`` label.

YAML::

    - type: by-label
      parameters:
        label: llm-d.ai/role
        validValues: [decode, both]
        allowsNoLabel: true
"""

from __future__ import annotations

from typing import ClassVar, Iterable

from pydantic import Field, model_validator

from epp.framework.endpoint import ROLE_LABEL, Endpoint
from epp.framework.plugins import CycleState, Filter, Handle, NoParams
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

__all__ = ["ByLabelFilter", "LabelValueFilter", "RoleFilter"]


class LabelValueFilter:
    """Shared rule: keep endpoints whose ``label`` value is in ``values`` (or that lack it, if allowed)."""

    type_name: ClassVar[str]

    def _setup(self, label: str, values: Iterable[str], allows_no_label: bool) -> None:
        self._label = label
        self._values = frozenset(values)
        self._allows_no_label = allows_no_label

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        label, values, allow_none = self._label, self._values, self._allows_no_label
        out: list[Endpoint] = []
        for ep in endpoints:
            value = ep.labels.get(label)
            if (allow_none if value is None else value in values):
                out.append(ep)
        return out


class ByLabelFilter(LabelValueFilter):
    """Keeps endpoints with ``label`` in ``validValues``, plus unlabeled ones when ``allowsNoLabel``."""

    type_name: ClassVar[str] = "by-label"

    class Params(PluginParams):
        label: str = Field(min_length=1)
        valid_values: list[str] = Field(default_factory=list, alias="validValues")
        allows_no_label: bool = Field(False, alias="allowsNoLabel")

        @model_validator(mode="after")
        def _not_empty(self) -> ByLabelFilter.Params:
            if not self.valid_values and not self.allows_no_label:
                raise ValueError("validValues is empty and allowsNoLabel is false, so nothing could pass")
            return self

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._setup(params.label, params.valid_values, params.allows_no_label)


class RoleFilter(LabelValueFilter):
    """Base of the role filters: a fixed value set on the ``llm-d.ai/role`` label, no parameters."""

    Params = NoParams
    roles: ClassVar[frozenset[str]]
    allows_no_label: ClassVar[bool] = False

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._setup(ROLE_LABEL, self.roles, self.allows_no_label)


_check: type[Filter] = ByLabelFilter
