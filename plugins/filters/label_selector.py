"""``label-selector-filter`` (alias ``by-label-selector``): keeps endpoints whose labels match a Kubernetes
label selector.

Semantics are Kubernetes' ``metav1.LabelSelector``: every ``matchLabels`` pair must be present with that value,
and every expression must hold. ``In`` (label present, value listed), ``NotIn`` (label absent or value not
listed), ``Exists``, ``DoesNotExist``. ``In``/``NotIn`` need ``values``; ``Exists``/``DoesNotExist`` must have
none. An empty selector keeps every endpoint; a selector nothing matches leaves none (the profile fails).

YAML::

    - type: label-selector-filter
      parameters:
        matchLabels:
          app: vllm
        matchExpressions:
        - {key: llm-d.ai/role, operator: In, values: [decode, both]}
        - {key: canary, operator: DoesNotExist}
"""

from __future__ import annotations

from typing import Callable, ClassVar, Literal, Mapping

from pydantic import Field, model_validator

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Filter, Handle
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

__all__ = ["LabelSelectorFilter", "LabelSelectorRequirement", "compile_selector"]

Matcher = Callable[[Mapping[str, str]], bool]


class LabelSelectorRequirement(PluginParams):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} on key '{self.key}' needs a non-empty 'values'")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} on key '{self.key}' must not have 'values'")
        return self


def _requirement(req: LabelSelectorRequirement) -> Matcher:
    key, values = req.key, frozenset(req.values)
    if req.operator == "In":
        return lambda labels: key in labels and labels[key] in values
    if req.operator == "NotIn":
        return lambda labels: key not in labels or labels[key] not in values
    if req.operator == "Exists":
        return lambda labels: key in labels
    return lambda labels: key not in labels


def _equals(key: str, value: str) -> Matcher:
    return lambda labels: labels.get(key) == value


def compile_selector(match_labels: Mapping[str, str], expressions: list[LabelSelectorRequirement]) -> list[Matcher]:
    """The selector as a list of predicates over a label mapping, all of which must hold."""
    matchers: list[Matcher] = [_equals(k, v) for k, v in match_labels.items()]
    matchers.extend(_requirement(req) for req in expressions)
    return matchers


class LabelSelectorFilter:
    """Keeps the endpoints whose labels satisfy ``matchLabels`` and every ``matchExpressions`` entry."""

    type_name: ClassVar[str] = "label-selector-filter"

    class Params(PluginParams):
        match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
        match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, alias="matchExpressions")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._matchers = compile_selector(params.match_labels, params.match_expressions)

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        matchers = self._matchers
        if not matchers:
            return endpoints
        return [ep for ep in endpoints if all(m(ep.labels) for m in matchers)]


_check: type[Filter] = LabelSelectorFilter
