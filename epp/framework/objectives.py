"""The pool's InferenceObjectives and InferenceModelRewrites: what a request's priority and target model are.

The reference's two ``v1alpha2`` resources (group ``llm-d.ai`` or ``inference.networking.x-k8s.io``), kept in memory
for the request path (:class:`Objectives` and :class:`ModelRewrites`, both on the Datastore); discovery fills them,
the request path only reads. The objective header names an InferenceObjective whose ``spec.priority`` the request
gets (:meth:`Objectives.priority` returns None for an unknown name, so callers can fall back). For the model a
request names, the oldest rule with an exact match wins, else the oldest generic rule, and the target is drawn from
its ``targets`` by weight. :func:`parse_objective` and :func:`parse_model_rewrite` read each resource's Kubernetes
JSON; ``ValueError`` names what is unusable.
"""

from __future__ import annotations

import builtins
import random
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

__all__ = ["Objectives", "ModelRewrites", "RewriteRule", "RewriteTarget", "ModelRewrite", "RewriteDecision",
           "parse_objective", "parse_model_rewrite", "pool_ref_matches", "POLICY_GROUPS", "POLICY_VERSION",
           "OBJECTIVE_PLURAL", "REWRITE_PLURAL", "DEFAULT_POOL_REF_GROUP"]

POLICY_GROUPS = ("llm-d.ai", "inference.networking.x-k8s.io")
"""The API groups both resources are read from, in precedence order: an object in ``llm-d.ai`` hides one of the
same name in ``inference.networking.x-k8s.io`` (llm-d's current group first, as llm-d-router reads them)."""
POLICY_VERSION = "v1alpha2"
OBJECTIVE_PLURAL = "inferenceobjectives"
REWRITE_PLURAL = "inferencemodelrewrites"
DEFAULT_POOL_REF_GROUP = "inference.networking.k8s.io"
"""``spec.poolRef.group`` when the object leaves it out (the CRD's default)."""


class Objectives:
    """InferenceObjective name -> priority (None = the objective sets no priority, which counts as 0)."""

    def __init__(self) -> None:
        self._priorities: dict[str, int | None] = {}

    def __len__(self) -> int:
        return len(self._priorities)

    def set(self, name: str, priority: int | None) -> None:
        """Add or replace one objective."""
        self._priorities[name] = priority

    def delete(self, name: str) -> None:
        """Forget one objective (no error if unknown)."""
        self._priorities.pop(name, None)

    def replace_all(self, objectives: Mapping[str, int | None]) -> None:
        """Make the set exactly ``objectives`` (after a re-list)."""
        self._priorities = dict(objectives)

    def priority(self, name: str | None) -> int | None:
        """The priority of objective ``name``: its value, 0 when it sets none, None when it is unknown."""
        if name is None or name not in self._priorities:
            return None
        return self._priorities[name] or 0


@dataclass(frozen=True, slots=True)
class RewriteTarget:
    """One weighted destination of a rewrite rule."""

    model: str
    weight: int | None = None


@dataclass(frozen=True, slots=True)
class RewriteRule:
    """A rule: the exact model names it matches (empty = every model) and where it sends them."""

    models: frozenset[str]
    targets: tuple[RewriteTarget, ...]

    def choose(self, rng: random.Random) -> str | None:
        """A target model drawn by weight (see the module docstring); None when the rule has no targets."""
        targets = self.targets
        if not targets:
            return None
        total = sum(t.weight or 0 for t in targets)
        if total <= 0:
            return targets[rng.randrange(len(targets))].model
        point = rng.randrange(total)
        for t in targets:
            point -= t.weight or 0
            if point < 0:
                return t.model
        return targets[-1].model


@dataclass(frozen=True, slots=True)
class ModelRewrite:
    """One InferenceModelRewrite: its name, creation time (epoch seconds) and ordered rules."""

    name: str
    created: float
    rules: tuple[RewriteRule, ...]


@dataclass(frozen=True, slots=True)
class RewriteDecision:
    """The rule chosen for a model and the name of the InferenceModelRewrite it came from."""

    rewrite_name: str
    rule: RewriteRule


class ModelRewrites:
    """The InferenceModelRewrites of the pool, indexed for :meth:`rule_for` (see the module docstring)."""

    def __init__(self) -> None:
        self._rewrites: dict[str, ModelRewrite] = {}
        self._exact: dict[str, RewriteDecision] = {}
        self._generic: RewriteDecision | None = None

    def __len__(self) -> int:
        return len(self._rewrites)

    def set(self, rewrite: ModelRewrite) -> None:
        """Add or replace one InferenceModelRewrite (by name)."""
        self._rewrites[rewrite.name] = rewrite
        self._reindex()

    def delete(self, name: str) -> None:
        """Forget one InferenceModelRewrite (no error if unknown)."""
        if self._rewrites.pop(name, None) is not None:
            self._reindex()

    def replace_all(self, rewrites: list[ModelRewrite]) -> None:
        """Make the set exactly ``rewrites`` (after a re-list)."""
        self._rewrites = {r.name: r for r in rewrites}
        self._reindex()

    def rule_for(self, model: str) -> RewriteDecision | None:
        """The rule that applies to requests for ``model``, or None."""
        decision = self._exact.get(model)
        return decision if decision is not None else self._generic

    def models(self) -> builtins.set[str]:  # ``set`` here would be the method above
        """Every model name a rule matches or sends requests to."""
        return {name for rewrite in self._rewrites.values() for rule in rewrite.rules
                for name in (*rule.models, *(t.model for t in rule.targets))}

    def _reindex(self) -> None:
        exact: dict[str, RewriteDecision] = {}
        generic: RewriteDecision | None = None
        for rewrite in sorted(self._rewrites.values(), key=lambda r: (r.created, r.name)):
            for rule in rewrite.rules:
                decision = RewriteDecision(rewrite.name, rule)
                if not rule.models:
                    generic = generic or decision
                for model in rule.models:
                    exact.setdefault(model, decision)
        self._exact, self._generic = exact, generic


def pool_ref_matches(obj: Mapping[str, Any], pool_name: str, pool_group: str = DEFAULT_POOL_REF_GROUP) -> bool:
    """Whether a resource's ``spec.poolRef`` names this pool (name and group; the group defaults as the CRD)."""
    ref = _mapping(_mapping(obj.get("spec")).get("poolRef"))
    return ref.get("name") == pool_name and (ref.get("group") or DEFAULT_POOL_REF_GROUP) == pool_group


def parse_objective(obj: Mapping[str, Any]) -> tuple[str, int | None]:
    """``(metadata.name, spec.priority)`` of an InferenceObjective; ``ValueError`` if unusable."""
    name = _name(obj)
    priority = _mapping(obj.get("spec")).get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ValueError(f"InferenceObjective {name}: spec.priority must be an integer, not {priority!r}")
    return name, priority


def parse_model_rewrite(obj: Mapping[str, Any]) -> ModelRewrite:
    """An InferenceModelRewrite's name, creation time and rules; ``ValueError`` naming the field if unusable."""
    name = _name(obj)
    rules = _mapping(obj.get("spec")).get("rules") or []
    if not isinstance(rules, list):
        raise ValueError(f"InferenceModelRewrite {name}: spec.rules must be a list")
    created = _timestamp(_mapping(obj.get("metadata")).get("creationTimestamp"))
    return ModelRewrite(name, created, tuple(_rule(name, i, r) for i, r in enumerate(rules)))


def _rule(name: str, index: int, raw: Any) -> RewriteRule:
    where = f"InferenceModelRewrite {name}: spec.rules[{index}]"
    rule = _mapping(raw)
    models = []
    for j, match in enumerate(rule.get("matches") or []):
        matcher = _mapping(_mapping(match).get("model"))
        value, kind = matcher.get("value"), matcher.get("type") or "Exact"
        if not isinstance(value, str) or not value:
            raise ValueError(f"{where}.matches[{j}].model.value must be a non-empty string")
        if kind != "Exact":
            raise ValueError(f"{where}.matches[{j}].model.type {kind!r} is not supported (only Exact)")
        models.append(value)
    targets: list[RewriteTarget] = []
    for j, target in enumerate(rule.get("targets") or []):
        t = _mapping(target)
        model, weight = t.get("modelRewrite"), t.get("weight")
        if not isinstance(model, str) or not model:
            raise ValueError(f"{where}.targets[{j}].modelRewrite must be a non-empty string")
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int)
                                   or not 0 <= weight <= 1_000_000):
            raise ValueError(f"{where}.targets[{j}].weight must be an integer from 1 to 1000000")
        targets.append(RewriteTarget(model, weight or None))
    return RewriteRule(frozenset(models), tuple(targets))


def _name(obj: Mapping[str, Any]) -> str:
    name = _mapping(obj.get("metadata")).get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name is missing")
    return name


def _timestamp(value: Any) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp (0 when absent: such objects sort first)."""
    if not isinstance(value, str) or not value:
        return 0.0
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f"metadata.creationTimestamp {value!r} is not an RFC 3339 time") from None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
