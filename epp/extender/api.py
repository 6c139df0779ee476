"""The JSON of ``k8s.io/kube-scheduler/extender/v1``, read and written (sans-I/O).

kube-scheduler POSTs ``ExtenderArgs`` (``Pod`` and, by ``nodeCacheCapable``, either ``NodeNames`` or ``Nodes``, a
v1 NodeList) and reads back an ``ExtenderFilterResult`` or a ``HostPriorityList``. The v1 structs have no JSON
tags, so kube-scheduler writes Go's field names (``{"Pod":…,"Nodes":null,"NodeNames":[…]}``) and decodes answers
case-insensitively; extenders written against the older ``pkg/scheduler/api/v1`` use lower-case tags (``pod``,
``nodenames``). :func:`parse_args` accepts both, as Go's decoder does (last matching key wins, unknown keys are
ignored); answers use the v1 field names. The filter answer has the form of the arguments: ``NodeNames`` for names,
``Nodes`` (the NodeList passed, its items filtered, each unchanged) for a NodeList. A body that is not such JSON
raises :class:`~epp.errors.InvalidJson` or :class:`~epp.errors.InvalidShape` (400).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from epp.errors import InvalidJson, InvalidShape

__all__ = ["ExtenderArgs", "parse_args", "filter_result", "error_result", "priority_list"]

_FIELDS = ("pod", "nodes", "nodenames")


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """One ``ExtenderArgs``: the pod, and the candidate nodes as names or as the NodeList sent."""

    pod: dict[str, Any]
    node_names: list[str] | None
    node_list: dict[str, Any] | None

    @property
    def nodes(self) -> list[str]:
        """The candidate node names, in the order sent (names win when both forms are present)."""
        if self.node_names is not None:
            return self.node_names
        return [item["metadata"]["name"] for item in _items(self.node_list)]


def parse_args(body: bytes) -> ExtenderArgs:
    """Read an ``ExtenderArgs`` body; InvalidJson or InvalidShape naming what is wrong."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJson(f"ExtenderArgs: the body is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidShape(f"ExtenderArgs: expected a JSON object, got {_kind(doc)}")
    fields: dict[str, Any] = {}
    for key, value in doc.items():
        if key.lower() in _FIELDS:  # Go's decoder: field names match case-insensitively
            fields[key.lower()] = value
    pod = fields.get("pod")
    if not isinstance(pod, dict):
        raise InvalidShape(f"ExtenderArgs: Pod must be a v1 Pod object, got {_kind(pod)}")
    names, node_list = _node_names(fields.get("nodenames")), _node_list(fields.get("nodes"))
    if names is None and node_list is None:
        raise InvalidShape("ExtenderArgs: no candidate nodes: give NodeNames (nodeCacheCapable) or Nodes")
    return ExtenderArgs(pod, names, node_list)


def filter_result(args: ExtenderArgs, passed: Sequence[str], failed: Mapping[str, str]) -> bytes:
    """The ``ExtenderFilterResult`` for ``args``: ``passed`` nodes in the form they came in, ``failed`` reasons."""
    result: dict[str, Any] = {}
    if args.node_names is not None:
        result["NodeNames"] = list(passed)
    if args.node_list is not None:
        keep = set(passed)
        result["Nodes"] = {**args.node_list,
                           "items": [i for i in _items(args.node_list) if i["metadata"]["name"] in keep]}
    result.update(FailedNodes=dict(failed), FailedAndUnresolvableNodes={}, Error="")
    return orjson.dumps(result)


def error_result(message: str) -> bytes:
    """An ``ExtenderFilterResult`` carrying only ``Error`` (kube-scheduler fails the extender's call with it)."""
    return orjson.dumps({"FailedNodes": {}, "Error": message})


def priority_list(scores: Sequence[tuple[str, int]]) -> bytes:
    """A ``HostPriorityList``: ``[{"Host": node, "Score": 0..10}, ...]``."""
    return orjson.dumps([{"Host": host, "Score": score} for host, score in scores])


def _node_names(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise InvalidShape(f"ExtenderArgs: NodeNames must be a list of node names, got {_kind(value)}")
    return value


def _node_list(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidShape(f"ExtenderArgs: Nodes must be a v1 NodeList object, got {_kind(value)}")
    items = value.get("items")
    if items is not None and not isinstance(items, list):
        raise InvalidShape(f"ExtenderArgs: Nodes.items must be a list of v1 Node objects, got {_kind(items)}")
    for i, item in enumerate(items or ()):
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            raise InvalidShape(f"ExtenderArgs: Nodes.items[{i}] is not a v1 Node with metadata.name")
    return value


def _items(node_list: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return (node_list or {}).get("items") or []


def _kind(value: Any) -> str:
    """How a JSON value is named in messages."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
