"""The object rules of :mod:`fake_kube`, the fake API server: the kinds it serves, its error answers
(``Status`` objects), label selectors, JSON merge patches, and the schema checks and defaults of the CRDs and
Leases it stores (what the real API server enforces through OpenAPI schemas; CEL rules are not evaluated)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

POOL_API = "inference.networking.k8s.io/v1"
X_API = "inference.networking.x-k8s.io/v1alpha2"
LLMD_API = "llm-d.ai/v1alpha2"
LEASE_API = "coordination.k8s.io/v1"
MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")


@dataclass(frozen=True)
class Kind:
    plural: str
    kind: str
    api_version: str
    namespaced: bool = True
    status: bool = True
    """Has a ``status`` subresource."""


KINDS = {
    "pods": Kind("pods", "Pod", "v1"),
    "inferencepools": Kind("inferencepools", "InferencePool", POOL_API),
    "inferenceobjectives": Kind("inferenceobjectives", "InferenceObjective", X_API),
    "inferencemodelrewrites": Kind("inferencemodelrewrites", "InferenceModelRewrite", X_API),
    "inferenceobjectives.llm-d.ai": Kind("inferenceobjectives", "InferenceObjective", LLMD_API),
    "inferencemodelrewrites.llm-d.ai": Kind("inferencemodelrewrites", "InferenceModelRewrite", LLMD_API),
    "leases": Kind("leases", "Lease", LEASE_API, status=False),
    "inferencepools.x-k8s.io": Kind("inferencepools", "InferencePool", X_API),
}
POLICY_PLURALS = ("inferenceobjectives", "inferencemodelrewrites", "inferenceobjectives.llm-d.ai",
                  "inferencemodelrewrites.llm-d.ai")


class HttpError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    def response(self) -> web.Response:
        return web.json_response(status_object(self.status, self.reason, self.message), status=self.status)


def status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_label_selector(text: str) -> list[tuple[str, str, str | None]]:
    """``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k`` terms -> (op, key, value)."""
    terms = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in raw:
            k, v = raw.split("!=", 1)
            terms.append(("!=", k.strip(), v.strip()))
        elif "==" in raw or "=" in raw:
            k, v = raw.split("==", 1) if "==" in raw else raw.split("=", 1)
            terms.append(("=", k.strip(), v.strip()))
        elif raw.startswith("!"):
            terms.append(("!", raw[1:].strip(), None))
        elif " in " in raw or " notin " in raw or "(" in raw:
            raise HttpError(400, "BadRequest", f"set-based selector not supported by the fake: {raw}")
        else:
            terms.append(("exists", raw, None))
    return terms


def label_match(terms: list[tuple[str, str, str | None]], labels: dict[str, str]) -> bool:
    for op, k, v in terms:
        if op == "=" and labels.get(k) != v:
            return False
        if op == "!=" and labels.get(k) == v:
            return False
        if op == "exists" and k not in labels:
            return False
        if op == "!" and k in labels:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


def validate_pool(obj: dict[str, Any]) -> None:
    """The InferencePool CRD's main schema constraints (HTTP 422 Invalid, as the API server answers): v1's, or
    v1alpha2's (``spec.selector`` a plain label map, ``spec.targetPortNumber``) for that apiVersion."""
    spec = obj.get("spec")
    problems = []
    if not isinstance(spec, dict):
        problems.append("spec: Required value")
        spec = {}
    if obj.get("apiVersion") == X_API:
        _validate_alpha2_pool(obj, spec, problems)
        return
    labels = (spec.get("selector") or {}).get("matchLabels")
    if not isinstance(labels, dict) or not 1 <= len(labels) <= 64:
        problems.append("spec.selector.matchLabels: must have 1 to 64 entries")
    ports = spec.get("targetPorts")
    if not isinstance(ports, list) or not 1 <= len(ports) <= 8:
        problems.append("spec.targetPorts: must have 1 to 8 items")
    else:
        numbers = [p.get("number") if isinstance(p, dict) else None for p in ports]
        if any(not isinstance(n, int) or not 1 <= n <= 65535 for n in numbers):
            problems.append("spec.targetPorts[].number: must be 1..65535")
        elif len(set(numbers)) != len(numbers):
            problems.append("spec.targetPorts: port numbers must be unique")
    ref = spec.get("endpointPickerRef")
    if ref is not None:
        if not isinstance(ref, dict) or not ref.get("name"):
            problems.append("spec.endpointPickerRef.name: Required value")
        elif ref.get("kind", "Service") == "Service" and not (ref.get("port") or {}).get("number"):
            problems.append("spec.endpointPickerRef.port: Required value when kind is Service")
    if problems:
        name = (obj.get("metadata") or {}).get("name", "")
        raise HttpError(422, "Invalid", f'InferencePool.{POOL_API.split("/")[0]} "{name}" is invalid: '
                        + "; ".join(problems))


def _validate_alpha2_pool(obj: dict[str, Any], spec: dict[str, Any], problems: list[str]) -> None:
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not 1 <= len(selector) <= 64:
        problems.append("spec.selector: must have 1 to 64 entries")
    port = spec.get("targetPortNumber")
    if not isinstance(port, int) or not 1 <= port <= 65535:
        problems.append("spec.targetPortNumber: must be 1..65535")
    if not (spec.get("extensionRef") or {}).get("name"):
        problems.append("spec.extensionRef.name: Required value")
    if problems:
        name = (obj.get("metadata") or {}).get("name", "")
        raise HttpError(422, "Invalid", f'InferencePool.{X_API.split("/")[0]} "{name}" is invalid: '
                        + "; ".join(problems))


def validate_lease(obj: dict[str, Any]) -> None:
    """A Lease's spec as the API server checks it: MicroTimes must decode (400), durations and counts must be in
    range (422, ``ValidateLeaseSpec``)."""
    spec = obj.get("spec") or {}
    name = (obj.get("metadata") or {}).get("name", "")
    for key in ("acquireTime", "renewTime"):
        value = spec.get(key)
        if value is not None and not (isinstance(value, str) and MICRO_TIME.fullmatch(value)):
            raise HttpError(400, "BadRequest", f"Lease in version \"v1\" cannot be handled as a Lease: "
                                               f"spec.{key}: parsing time {value!r} as RFC 3339 with microseconds")
    problems = []
    duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
    if duration is not None and (not isinstance(duration, int) or duration <= 0):
        problems.append(f"spec.leaseDurationSeconds: Invalid value: {duration}: must be greater than 0")
    if transitions is not None and (not isinstance(transitions, int) or transitions < 0):
        problems.append(f"spec.leaseTransitions: Invalid value: {transitions}: must be greater than or equal to 0")
    if problems:
        raise HttpError(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: ' + "; ".join(problems))


def default_and_validate_policy(plural: str, obj: dict[str, Any]) -> None:
    """Apply the v1alpha2 CRD defaults to an InferenceObjective / InferenceModelRewrite and check its main
    schema constraints (HTTP 422 Invalid otherwise)."""
    spec = obj.get("spec")
    problems = []
    if not isinstance(spec, dict):
        spec = obj["spec"] = {}
    ref = spec.get("poolRef")
    if not isinstance(ref, dict) or not ref.get("name"):
        problems.append("spec.poolRef.name: Required value")
    else:
        ref.setdefault("group", "inference.networking.k8s.io")
        ref.setdefault("kind", "InferencePool")
    kind = KINDS[plural]
    if kind.kind == "InferenceObjective":
        priority = spec.get("priority")
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            problems.append("spec.priority: must be an integer")
    else:
        rules = spec.get("rules")
        if not isinstance(rules, list):
            problems.append("spec.rules: Required value")
            rules = []
        for i, rule in enumerate(rules):
            for match in rule.get("matches") or []:
                model = match.get("model") or {}
                model.setdefault("type", "Exact")
                if model["type"] != "Exact" or not model.get("value"):
                    problems.append(f"spec.rules[{i}].matches[].model: type must be Exact and value non-empty")
            targets = rule.get("targets")
            if targets is not None and not targets:
                problems.append(f"spec.rules[{i}].targets: must have at least 1 item")
            for target in targets or []:
                weight = target.get("weight")
                if not target.get("modelRewrite"):
                    problems.append(f"spec.rules[{i}].targets[].modelRewrite: Required value")
                if weight is not None and (not isinstance(weight, int) or not 1 <= weight <= 1_000_000):
                    problems.append(f"spec.rules[{i}].targets[].weight: must be 1..1000000")
    if problems:
        name = (obj.get("metadata") or {}).get("name", "")
        raise HttpError(422, "Invalid", f'{kind.kind}.{kind.api_version.split("/")[0]} "{name}" is invalid: '
                        + "; ".join(problems))
