"""Bounded metric labels: the values EPP's metrics record for what clients send (model names, fairness id).

A client names any model (body, ``x-llm-d-router-model-name-rewrite``) and any fairness id (header); recorded as
sent, each new value would add a few hundred series. :class:`RequestLabels` is the one place a request's label
values are chosen, for every family that carries them and both front ends:

- a model name the pool serves (:class:`ServedModels`) keeps its own value; of the others, the first
  ``--model-name-metric-label-limit`` distinct ones do too, any later new one reads ``other``;
- a fairness id keeps its value for the first ``--fairness-id-metric-label-limit`` distinct ones, then ``other``;
- a family with several of these labels records at most ``--metric-label-set-limit`` combinations; a new one
  past it records ``other`` for the fairness id and for any model not served.

Each check is one set lookup for a value seen before. Rule, defaults and worst cases: docs/datalayer.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

from epp.metrics.instruments import DEFAULT_FAIRNESS_ID_LIMIT, DEFAULT_MODEL_NAME_LIMIT, LabelCap

if TYPE_CHECKING:
    from epp.datalayer.datastore import Datastore

__all__ = ["DEFAULT_LABEL_SET_LIMIT", "OTHER", "RequestLabels", "ServedModels", "unparsed_model"]

OTHER = LabelCap.OVERFLOW
_Key = TypeVar("_Key", bound=tuple[str, ...])
DEFAULT_LABEL_SET_LIMIT = 2000
"""Label combinations recorded before new ones fold (``--metric-label-set-limit``; OpenTelemetry SDKs' default
cardinality limit per metric)."""


def unparsed_model(name: str) -> bool:
    """The one model name served without a pool: the empty one, of a request refused before its body was read."""
    return not name


class ServedModels:
    """``served(name)``: whether the pool serves model ``name``, as EPP knows it: the models each endpoint's
    ``models-data-extractor`` stored (its ``/v1/models``: the list the gateway's ``/v1/models`` serves), the LoRA
    adapters its metrics report running or waiting, every model an InferenceModelRewrite matches or targets, and
    the empty name. A name found is answered from a cached set; a name not found recomputes it at most once per
    ``ttl`` seconds, so a flood of unknown names costs a set lookup each plus one pass over the pool per ``ttl``."""

    __slots__ = ("_clock", "_expires", "_names", "datastore", "ttl")

    def __init__(self, datastore: Datastore, *, ttl: float = 1.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.datastore = datastore
        self.ttl = ttl
        self._clock = clock
        self._names: set[str] = {""}
        self._expires = float("-inf")

    def __call__(self, name: str) -> bool:
        if name in self._names:
            return True
        now = self._clock()
        if now < self._expires:
            return False
        self._expires = now + self.ttl
        self._names = self.names()
        return name in self._names

    def names(self) -> set[str]:
        """The served names now (computed from the Datastore, not cached)."""
        # Imported here: the data layer package is heavy, and this runs at most once per ttl.
        from epp.datalayer.models import stored_models

        names = {""}
        for ep in self.datastore.endpoints():
            stored = stored_models(ep)
            if stored is not None:
                names.update(model.id for model in stored)
            names |= ep.metrics.running_loras
            names |= ep.metrics.waiting_loras
        names |= self.datastore.rewrites.models()
        return names


class RequestLabels:
    """Chooses a request's (model, target model, fairness id) label values (see the module docstring). ``models``
    and ``fairness_ids`` bound each label; ``limit`` bounds their combinations. A combination recorded once is
    recorded as it is for good; one folded is not remembered, so it may pass later if a model it names became
    served: a gauge must be decremented with the labels it was incremented with (callers keep those)."""

    __slots__ = ("_sets", "fairness_ids", "limit", "models")

    def __init__(self, models: LabelCap | None = None, fairness_ids: LabelCap | None = None,
                 limit: int = DEFAULT_LABEL_SET_LIMIT) -> None:
        if limit < 0:
            raise ValueError(f"label set limit must be non-negative, got {limit}")
        self.models = models or LabelCap(DEFAULT_MODEL_NAME_LIMIT, known=unparsed_model)
        self.fairness_ids = fairness_ids or LabelCap(DEFAULT_FAIRNESS_ID_LIMIT)
        self.limit = limit
        self._sets: set[tuple[str, ...]] = set()

    def __call__(self, model: str, target: str, fairness_id: str) -> tuple[str, str, str]:
        """The label values of a request for ``model`` routed as ``target`` with ``fairness_id``."""
        sent = (model, target, fairness_id)
        if sent in self._sets:
            return sent
        models = self.models
        return self._admit((models(model), models(target), self.fairness_ids(fairness_id)))

    def pair(self, model: str, target: str) -> tuple[str, str]:
        """The label values of (model, target model) for a family without a fairness id."""
        sent = (model, target)
        if sent in self._sets:
            return sent
        return self._admit((self.models(model), self.models(target)))

    def _admit(self, key: _Key) -> _Key:
        sets = self._sets
        if key in sets:
            return key
        if len(sets) >= self.limit:
            # Past the limit only served models keep their names: at most (served + 1)^2 more combinations.
            served = self.models.known or unparsed_model
            key = cast(_Key, (*(name if name == OTHER or served(name) else OTHER for name in key[:2]),
                               *(OTHER for _ in key[2:])))  # as many values as key: its tuple type
        sets.add(key)
        return key
