"""Strict loading of rendered objects, so a misspelt or misplaced field fails a test instead of being dropped.

- Built-in kinds go into the ``kubernetes_asyncio`` client's generated models (the ``kubernetes`` package's models).
  Their deserializer ignores unknown keys, so :func:`load_builtin` walks the object itself: every key must be in the
  model's ``attribute_map``, every value of the type ``openapi_types`` names, and each model is constructed with
  client-side validation on, which refuses a missing required field.
- Custom resources (and configuration files with a published schema) are checked against their OpenAPI v3 schema
  by :func:`check_schema`, as the API server's structural-schema validation does, except that an unknown field is
  an error rather than pruned; CEL rules (``x-kubernetes-validations``) are not evaluated. Their ``metadata`` is
  a ``V1ObjectMeta``. The schemas are in ``tests/k8s/schemas/`` (each file names its source).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml

SCHEMAS = Path(__file__).parent / "schemas"

# (apiVersion, kind) -> the generated model class of every built-in kind the manifests use.
BUILTIN = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
}
# (apiVersion, kind) -> the schema file of every custom resource the manifests use.
CUSTOM = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.yaml",
    ("gateway.networking.k8s.io/v1", "Gateway"): "gateway-v1.yaml",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.yaml",
}
_PRIMITIVES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float),
                                            "datetime": (str,), "date": (str,)}


class StrictError(AssertionError):
    """An object does not fit its model or schema; the message names the path of the offending field."""


def load(obj: dict[str, Any]) -> Any:
    """Check ``obj`` strictly (a model for built-in kinds, the CRD schema for custom ones); returns the model or
    the object."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    where = f"{key[1]} {obj.get('metadata', {}).get('name')}"
    if key in BUILTIN:
        return load_builtin(obj, BUILTIN[key], where)
    if key in CUSTOM:
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise StrictError(f"{where}: metadata missing")
        load_builtin(meta, "V1ObjectMeta", f"{where}.metadata")
        check_schema(obj, schema(CUSTOM[key]), where, skip=("metadata",))
        return obj
    raise StrictError(f"{where}: no model or schema for apiVersion {key[0]} kind {key[1]}")


@functools.cache
def _configuration() -> Any:
    from kubernetes_asyncio.client import Configuration

    cfg = Configuration()
    cfg.client_side_validation = True
    return cfg


def load_builtin(value: Any, type_name: str, path: str) -> Any:
    """``value`` as the model ``type_name`` (see the module docstring); ``StrictError`` naming ``path``."""
    from kubernetes_asyncio import client

    if type_name.startswith("list["):
        if not isinstance(value, list):
            raise StrictError(f"{path}: expected a list, got {type(value).__name__}")
        return [load_builtin(v, type_name[5:-1], f"{path}[{i}]") for i, v in enumerate(value)]
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            raise StrictError(f"{path}: expected a map, got {type(value).__name__}")
        inner = type_name[len("dict(str, "):-1]
        return {k: load_builtin(v, inner, f"{path}.{k}") for k, v in value.items()}
    if type_name == "object":  # int-or-string, quantities, raw extensions: any JSON value
        return value
    if type_name in _PRIMITIVES:
        if not isinstance(value, _PRIMITIVES[type_name]) or (isinstance(value, bool) and type_name != "bool"):
            raise StrictError(f"{path}: expected {type_name}, got {value!r}")
        return value
    klass = getattr(client, type_name)
    if not isinstance(value, dict):
        raise StrictError(f"{path}: expected a {type_name} object, got {value!r}")
    attrs = {json_key: attr for attr, json_key in klass.attribute_map.items()}
    unknown = sorted(set(value) - set(attrs))
    if unknown:
        raise StrictError(f"{path}: unknown field(s) {unknown} for {type_name}")
    kwargs = {attrs[k]: load_builtin(v, klass.openapi_types[attrs[k]], f"{path}.{k}") for k, v in value.items()}
    try:
        return klass(**kwargs, local_vars_configuration=_configuration())
    except ValueError as exc:  # the generated setters' client-side validation
        raise StrictError(f"{path}: {exc}") from None


# -- OpenAPI v3 (structural) schemas -------------------------------------------------------------------------------


@functools.cache
def schema(name: str) -> dict[str, Any]:
    """A schema file of ``tests/k8s/schemas`` (its ``schema`` key; ``source`` says where it was copied from)."""
    doc = yaml.safe_load((SCHEMAS / name).read_text())
    assert doc.get("source"), f"{name} does not name its source"
    return dict(doc["schema"])


def check_schema(value: Any, node: dict[str, Any], path: str, skip: tuple[str, ...] = ()) -> None:
    """Check ``value`` against the schema ``node`` (see the module docstring); ``StrictError`` naming ``path``."""
    if node.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            raise StrictError(f"{path}: expected an integer or a string, got {value!r}")
        return
    kind = node.get("type")
    checks = {"object": _check_object, "array": _check_array, "string": _check_string, "integer": _check_number,
              "number": _check_number, "boolean": _check_boolean}
    if kind not in checks:
        raise StrictError(f"{path}: schema without a type this checker knows ({kind!r})")
    checks[kind](value, node, path, skip)


def _check_object(value: Any, node: dict[str, Any], path: str, skip: tuple[str, ...]) -> None:
    if not isinstance(value, dict):
        raise StrictError(f"{path}: expected an object, got {value!r}")
    missing = [k for k in node.get("required", []) if k not in value]
    if missing:
        raise StrictError(f"{path}: required field(s) missing: {missing}")
    for bound, op in (("minProperties", int.__lt__), ("maxProperties", int.__gt__)):
        if bound in node and op(len(value), node[bound]):
            raise StrictError(f"{path}: {len(value)} entries, {bound} is {node[bound]}")
    props, extra = node.get("properties"), node.get("additionalProperties")
    for key, item in value.items():
        if key in skip:
            continue
        if props is not None and key in props:
            check_schema(item, props[key], f"{path}.{key}")
        elif isinstance(extra, dict):
            check_schema(item, extra, f"{path}.{key}")
        elif not node.get("x-kubernetes-preserve-unknown-fields"):
            raise StrictError(f"{path}: unknown field {key!r} (known: {sorted(props or {})})")


def _check_array(value: Any, node: dict[str, Any], path: str, skip: tuple[str, ...]) -> None:
    if not isinstance(value, list):
        raise StrictError(f"{path}: expected a list, got {value!r}")
    if len(value) < node.get("minItems", 0) or len(value) > node.get("maxItems", len(value)):
        raise StrictError(f"{path}: {len(value)} items, outside [{node.get('minItems', 0)}, {node.get('maxItems')}]")
    for i, item in enumerate(value):
        check_schema(item, node["items"], f"{path}[{i}]")


def _check_string(value: Any, node: dict[str, Any], path: str, skip: tuple[str, ...]) -> None:
    if not isinstance(value, str):
        raise StrictError(f"{path}: expected a string, got {value!r}")
    if "enum" in node and value not in node["enum"]:
        raise StrictError(f"{path}: {value!r} is not one of {node['enum']}")
    if not node.get("minLength", 0) <= len(value) <= node.get("maxLength", len(value)):
        raise StrictError(f"{path}: length {len(value)} outside the schema's bounds")
    if "pattern" in node and not re.search(node["pattern"], value):
        raise StrictError(f"{path}: {value!r} does not match {node['pattern']}")


def _check_number(value: Any, node: dict[str, Any], path: str, skip: tuple[str, ...]) -> None:
    wanted = (int,) if node["type"] == "integer" else (int, float)
    if not isinstance(value, wanted) or isinstance(value, bool):
        raise StrictError(f"{path}: expected {node['type']}, got {value!r}")
    if value < node.get("minimum", value) or value > node.get("maximum", value):
        raise StrictError(f"{path}: {value} outside [{node.get('minimum')}, {node.get('maximum')}]")


def _check_boolean(value: Any, node: dict[str, Any], path: str, skip: tuple[str, ...]) -> None:
    if not isinstance(value, bool):
        raise StrictError(f"{path}: expected a boolean, got {value!r}")
