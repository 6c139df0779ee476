"""Kubernetes objects -> endpoints: pure functions of InferencePool and Pod JSON, no I/O.

A Pod contributes one endpoint per target port of its pool (``<pod>-rank-<i>`` at ``podIP:port``, scraped on that
port, labelled with the Pod's labels) when it is Ready, not being deleted, has an IP and matches the pool's
selector; the annotation ``inference.networking.k8s.io/active-ports`` narrows the live ports. The watch machinery
that feeds these functions is :mod:`epp.datalayer.kubernetes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from epp.errors import ConfigError
from epp.framework.endpoint import EndpointSpec

__all__ = ["PoolSpec", "pod_ready", "pod_endpoints", "parse_selector", "POOL_GROUP", "POOL_VERSION", "POOL_PLURAL",
           "POOL_VERSIONS", "ACTIVE_PORTS_ANNOTATION"]

POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"
POOL_VERSIONS = {POOL_GROUP: POOL_VERSION, "inference.networking.x-k8s.io": "v1alpha2"}
"""The InferencePool API groups EPP reads, with their version (v1alpha2 is the pre-v1 API)."""
POOL_PLURAL = "inferencepools"
ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What endpoint discovery needs from an InferencePool: its label selector and target ports."""

    selector: Mapping[str, str]
    target_ports: tuple[int, ...]

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PoolSpec:
        """Read a v1 pool (``spec.selector.matchLabels``, ``spec.targetPorts[].number``) or a v1alpha2 one
        (``spec.selector`` as a plain label map, ``spec.targetPortNumber``); ``ValueError`` if unusable."""
        spec = obj.get("spec") or {}
        selector = spec.get("selector") or {}
        v1 = "targetPorts" in spec or "matchLabels" in selector
        labels = selector.get("matchLabels") if v1 else selector
        where = "spec.selector.matchLabels" if v1 else "spec.selector"
        if not isinstance(labels, dict) or not labels:
            raise ValueError(f"{where} must be a non-empty mapping")
        entries = (spec.get("targetPorts") or []) if v1 else [{"number": spec.get("targetPortNumber")}]
        ports = []
        for entry in entries:
            number = entry.get("number") if isinstance(entry, dict) else None
            if not isinstance(number, int) or not 1 <= number <= 65535:
                raise ValueError(f"spec.targetPorts: invalid port {entry!r}" if v1 else
                                 f"spec.targetPortNumber: invalid port {number!r}")
            ports.append(number)
        if not ports:
            raise ValueError("spec.targetPorts must list at least one port")
        return cls({str(k): str(v) for k, v in labels.items()}, tuple(ports))

    def label_selector(self) -> str:
        """The selector as a Kubernetes ``labelSelector`` query string (equality terms, sorted)."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.selector.items())


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Ready (condition ``Ready=True``), not being deleted, and with an IP."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def pod_endpoints(pod: Mapping[str, Any], pool: PoolSpec, metrics_port: int | None = None) -> list[EndpointSpec]:
    """The endpoints a Pod contributes to the pool (none unless it is ready and matches the selector). Each is
    scraped on its own port, or on ``metrics_port`` when given and the pool has a single target port (the
    reference's legacy ``--model-server-metrics-port``)."""
    meta = pod.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    if not pod_ready(pod) or not pool.matches(labels):
        return []
    active = _active_ports(meta.get("annotations") or {}, pool.target_ports)
    ip, name, ns = pod["status"]["podIP"], meta.get("name", ""), meta.get("namespace") or ""
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    single = metrics_port if metrics_port and len(pool.target_ports) == 1 else None
    return [EndpointSpec(name=f"{name}-rank-{i}", address=ip, port=port, labels=labels, metrics_port=single or port,
                         namespace=ns, node=node)
            for i, port in enumerate(pool.target_ports) if port in active]


def _active_ports(annotations: Mapping[str, str], target_ports: tuple[int, ...]) -> frozenset[int]:
    raw = annotations.get(ACTIVE_PORTS_ANNOTATION)
    if raw is None:
        return frozenset(target_ports)
    active = set()
    for part in str(raw).split(","):
        try:
            port = int(part.strip())
        except ValueError:
            continue  # as the reference: unparsable entries are ignored
        if port in target_ports:
            active.add(port)
    return frozenset(active)


def parse_selector(text: str) -> dict[str, str]:
    """``--endpoint-selector`` syntax, ``k=v,k2=v2`` (equality terms only) -> labels; ``ConfigError`` if bad."""
    labels: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = term.partition("==" if "==" in term else "=")
        if not sep or not key.strip() or "!" in key:
            raise ConfigError(f"endpoint selector term {term!r} is not key=value", field="endpoint-selector")
        labels[key.strip()] = value.strip()
    if not labels:
        raise ConfigError("endpoint selector is empty", field="endpoint-selector")
    return labels
