"""Where kube-scheduler should place a pod, judged by EPP's live view of its pool (the scheduler extender's policy).

Pure: no I/O, no clock of its own; every answer is computed from the endpoints passed in, so scores follow the
pool's state call by call. The pool's endpoints on a candidate node (``Endpoint.spec.node``) are *known* when they
were scraped and are healthy, else *unknown* (never scraped, stale or failing: nothing says how loaded they are).

- saturation(node) = the configured detector over the node's known endpoints (what EPP's admission calls saturated)
- headroom(node)   = 1 - (clamp(saturation) · known + 1 · unknown) / all  (an unknown endpoint has no headroom;
                     a node without endpoints of the pool has headroom 1)
- filter:     a model-server pod fails nodes whose saturation is ≥ 1, unless every candidate is saturated (then
              none fails: a new replica is what relieves a saturated pool); other pods (an EPP) are never filtered
- prioritize: 10 · headroom, rounded; a decode pod of a disaggregated pool (one with prefill endpoints):
              10 · (¼ headroom + ¾ headroom of the node's prefill endpoints), so it lands near prefill capacity
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from epp.framework.endpoint import ROLE_LABEL, Endpoint
from epp.framework.plugins import SaturationDetector

__all__ = ["NodePlacer", "MAX_PRIORITY", "PREFILL_WEIGHT", "SATURATED_REASON", "REVISION_LABELS"]

MAX_PRIORITY = 10
"""``MaxExtenderPriority`` of ``k8s.io/kube-scheduler/extender/v1``: the highest score a node gets."""
PREFILL_WEIGHT = 0.75
"""A decode pod's share of the score that comes from the prefill headroom on the node (the rest: the node's)."""
SATURATED_REASON = "the pool's model servers on this node are saturated (EPP)"
"""The failure reason of a filtered node. One fixed text: kube-scheduler counts nodes by reason in its event."""
REVISION_LABELS = frozenset({"pod-template-hash", "controller-revision-hash", "statefulset.kubernetes.io/pod-name",
                             "apps.kubernetes.io/pod-index"})
"""Labels that differ between revisions or replicas of one workload: never used to tell a pool's pods."""


class NodePlacer:
    """The extender's policy over one saturation detector; ``role_label`` names pods' and endpoints' P/D role."""

    def __init__(self, detector: SaturationDetector, *, role_label: str = ROLE_LABEL) -> None:
        self.detector = detector
        self.role_label = role_label

    def filter(self, pod: Mapping[str, Any], nodes: Sequence[str],
               endpoints: Sequence[Endpoint]) -> tuple[list[str], dict[str, str]]:
        """(nodes that pass, in the given order; {failed node: reason})"""
        if not self.is_model_server(pod, endpoints):
            return list(nodes), {}
        groups = _by_node(nodes, endpoints)
        failed = {node: SATURATED_REASON for node in nodes if self._saturated(groups[node])}
        if len(failed) == len(set(nodes)):
            return list(nodes), {}  # all saturated: leaving the pod Pending would block the scale-up that helps
        return [node for node in nodes if node not in failed], failed

    def prioritize(self, pod: Mapping[str, Any], nodes: Sequence[str],
                   endpoints: Sequence[Endpoint]) -> list[tuple[str, int]]:
        """(node, score 0..10) for every node in `nodes`, in order."""
        groups = _by_node(nodes, endpoints)
        near_prefill = (_labels(pod).get(self.role_label) == "decode"
                        and any(self._role(ep) == "prefill" for ep in endpoints))
        scores = []
        for node in nodes:
            value = self.headroom(groups[node])
            if near_prefill:
                prefill = [ep for ep in groups[node] if self._role(ep) == "prefill"]
                value = (1 - PREFILL_WEIGHT) * value + PREFILL_WEIGHT * (self.headroom(prefill) if prefill else 0.0)
            scores.append((node, _score(value)))
        return scores

    def is_model_server(self, pod: Mapping[str, Any], endpoints: Sequence[Endpoint]) -> bool:
        """Whether ``pod`` looks like one of the pool's model servers: it has a role label, or it carries every
        label the pool's endpoints all share (the pool's selector is among them), revision labels aside. An empty
        pool, or one whose endpoints share no label, takes every pod for a model server."""
        labels = _labels(pod)
        if self.role_label in labels:
            return True
        shared = _shared_labels(endpoints, REVISION_LABELS | {self.role_label})
        return all(labels.get(key) == value for key, value in shared.items())

    def saturation(self, endpoints: Sequence[Endpoint]) -> float | None:
        """The detector's saturation over the known ones of ``endpoints``; None when none is known."""
        known = [ep for ep in endpoints if _known(ep)]
        return self.detector.saturation(known) if known else None

    def headroom(self, endpoints: Sequence[Endpoint]) -> float:
        """1 - saturation in [0, 1], each unknown endpoint counting as saturated; 1.0 for no endpoints."""
        if not endpoints:
            return 1.0
        known = [ep for ep in endpoints if _known(ep)]
        load = min(1.0, max(0.0, self.detector.saturation(known))) * len(known) if known else 0.0
        return 1.0 - (load + len(endpoints) - len(known)) / len(endpoints)

    def _saturated(self, endpoints: Sequence[Endpoint]) -> bool:
        # Only evidence fails a node: unknown endpoints alone would turn a scrape outage into unschedulable nodes.
        value = self.saturation(endpoints)
        return value is not None and value >= 1.0

    def _role(self, endpoint: Endpoint) -> str | None:
        return endpoint.labels.get(self.role_label)


def _known(endpoint: Endpoint) -> bool:
    """Scraped at least once and healthy (the scraper marks stale or failing endpoints unhealthy)."""
    return endpoint.healthy and endpoint.metrics.update_time > 0


def _by_node(nodes: Sequence[str], endpoints: Sequence[Endpoint]) -> dict[str, list[Endpoint]]:
    """The endpoints on each of ``nodes`` (endpoints with no known node belong to none)."""
    groups: dict[str, list[Endpoint]] = {node: [] for node in nodes}
    for ep in endpoints:
        group = groups.get(ep.spec.node) if ep.spec.node else None
        if group is not None:
            group.append(ep)
    return groups


def _score(headroom: float) -> int:
    return min(MAX_PRIORITY, max(0, int(headroom * MAX_PRIORITY + 0.5)))


def _labels(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod's ``metadata.labels`` ({} when absent or malformed: a label-less pod)."""
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def _shared_labels(endpoints: Sequence[Endpoint], ignored: frozenset[str]) -> dict[str, str]:
    """The labels (key and value) every endpoint has, but ``ignored`` keys; {} for no endpoints."""
    if not endpoints:
        return {}
    shared = {k: v for k, v in endpoints[0].labels.items() if k not in ignored}
    for ep in endpoints[1:]:
        shared = {k: v for k, v in shared.items() if ep.labels.get(k) == v}
    return shared
