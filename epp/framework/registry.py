"""The plugin registry: type name -> plugin class, plus third-party plugins from entry points.

There is no global registry and this module knows no plugin: the composition root
(:func:`epp.runtime.builtins.default_registry`) builds one, registering the built-ins and then every entry point
in the ``epp.plugins`` group (:meth:`Registry.load_entry_points`), and hands it to the config loader. An entry
point may name a plugin class (registered under its ``type_name``) or a callable ``register(registry)``. A plugin
class has a ``type_name``, a pydantic ``Params`` model and ``__init__(name, params, handle)``.
"""

from __future__ import annotations

import importlib.metadata
import logging
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

import orjson
from pydantic import BaseModel, ValidationError

from epp.errors import ConfigError
from epp.framework.plugins import Handle, Params, Plugin

__all__ = ["Registry", "ENTRY_POINT_GROUP", "format_validation_error", "drop_null_fields"]

ENTRY_POINT_GROUP = "epp.plugins"
log = logging.getLogger(__name__)

class Registry:
    """Maps type names (and deprecated aliases) to plugin classes and builds instances from YAML parameters."""

    def __init__(self) -> None:
        self._types: dict[str, type] = {}
        self._aliases: dict[str, str] = {}

    def register(self, cls: type, *, aliases: tuple[str, ...] = ()) -> type:
        """Register ``cls`` under ``cls.type_name`` (and ``aliases``); re-registering a name is an error."""
        type_name = getattr(cls, "type_name", None)
        if not isinstance(type_name, str) or not type_name:
            raise ConfigError(f"plugin class {cls.__qualname__} has no type_name")
        for name in (type_name, *aliases):
            if name in self._types or name in self._aliases:
                raise ConfigError(f"plugin type '{name}' is registered twice", plugin=name)
        self._types[type_name] = cls
        for alias in aliases:
            self._aliases[alias] = type_name
        return cls

    def resolve(self, type_name: str) -> str:
        """The canonical type name for ``type_name`` (following aliases); unknown names pass through."""
        return self._aliases.get(type_name, type_name)

    def __contains__(self, type_name: str) -> bool:
        return self.resolve(type_name) in self._types

    def types(self) -> list[str]:
        """All canonical type names, sorted."""
        return sorted(self._types)

    def plugin_class(self, type_name: str) -> type:
        """The class registered for ``type_name``; ``ConfigError`` naming it if there is none."""
        cls = self._types.get(self.resolve(type_name))
        if cls is None:
            raise ConfigError(f"plugin type '{type_name}' is not registered (EPP does not implement it)",
                              plugin=type_name)
        return cls

    def params_model(self, type_name: str) -> type[Params]:
        """The ``Params`` model of the class registered for ``type_name``; ``ConfigError`` if it has none."""
        model = getattr(self.plugin_class(type_name), "Params", None)
        if not (isinstance(model, type) and issubclass(model, Params)):
            raise ConfigError(f"plugin type '{type_name}' has no Params model", plugin=type_name)
        return model

    def validate_params(self, type_name: str, name: str, raw: dict[str, Any] | None) -> Params:
        """Validate raw YAML ``parameters`` against the plugin's ``Params`` model, as Go's ``encoding/json``
        decodes them into a struct holding the defaults: strictly typed (no string for a number, no bool for a
        number; an integer for a float is fine), strings for enums and lists for tuples, and a null parameter
        leaves its default (:func:`drop_null_fields`). ``raw`` must be JSON data with finite numbers (orjson
        would write NaN as null), which :func:`~epp.config.yaml_lines.load_yaml` guarantees."""
        model = self.params_model(type_name)
        try:
            data = drop_null_fields(raw or {}, model)
            return model.model_validate_json(orjson.dumps(data), strict=True)
        except ValidationError as exc:
            field, msg = format_validation_error(exc)
            raise ConfigError(f"plugin '{name}' (type: {type_name}): parameter {msg}", plugin=name,
                              field=field) from exc
        except orjson.JSONEncodeError as exc:
            raise ConfigError(f"plugin '{name}' (type: {type_name}): parameters are not JSON data ({exc})",
                              plugin=name, field="parameters") from exc

    def create(self, type_name: str, name: str, raw: dict[str, Any] | None, handle: Handle) -> Plugin:
        """Build a plugin instance from its type, name and raw parameters; errors name the plugin."""
        if type_name not in self:
            named = f"plugin '{name}': " if name != type_name else ""
            raise ConfigError(f"{named}plugin type '{type_name}' is not registered (EPP does not implement it)",
                              plugin=name, field="type")
        cls = self.plugin_class(type_name)
        params = self.validate_params(type_name, name, raw)
        try:
            plugin = cls(name, params, handle)
        except ConfigError:
            raise
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"plugin '{name}' (type: {type_name}): {exc}", plugin=name) from exc
        return plugin

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> list[str]:
        """Register every plugin advertised in the entry-point ``group``; returns the names loaded."""
        loaded = []
        for ep in importlib.metadata.entry_points(group=group):
            target = ep.load()
            if isinstance(target, type):
                self.register(target)
            elif callable(target):
                target(self)
            else:
                raise ConfigError(f"entry point '{ep.name}' in group {group} is neither a plugin class nor a "
                                  f"register function")
            loaded.append(ep.name)
        return loaded

def format_validation_error(exc: ValidationError, noun: str = "parameter") -> tuple[str, str]:
    """(field path, readable message) of the first error in a pydantic ``ValidationError``; ``noun`` names what
    an unknown key is not (a plugin's "parameter", a config "field")."""
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err.get("loc", ())) or "<root>"
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return field, f"'{field}' is not a known {noun}"
    return field, f"'{field}': {err.get('msg', 'invalid')}"


def drop_null_fields(data: Any, model: type[BaseModel]) -> Any:
    """``data`` without the null-valued keys that name fields of ``model``, in nested models too (through
    optional, list and dict fields). Go's ``encoding/json`` leaves a struct field as it was (its default) when it
    reads null, so null means "not set"; keys that are not fields stay, for strict validation to reject them."""
    if not isinstance(data, dict):
        return data
    fields = {key: info.annotation for name, info in model.model_fields.items()
              for key in {name, info.alias or name}}
    return {key: value if key not in fields else _drop_nulls_in(value, fields[key])
            for key, value in data.items() if not (value is None and key in fields)}


def _drop_nulls_in(value: Any, annotation: Any) -> Any:
    """``value`` with :func:`drop_null_fields` applied to the models ``annotation`` holds it in."""
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return drop_null_fields(value, annotation)
    if origin is Annotated:
        return _drop_nulls_in(value, args[0])
    if origin in (Union, types.UnionType):
        models = [a for a in args if a is not type(None)]
        return _drop_nulls_in(value, models[0]) if len(models) == 1 else value
    if isinstance(value, list) and (origin in (list, Sequence) or (origin is tuple and args[-1:] == (...,))):
        return [_drop_nulls_in(item, args[0]) for item in value]
    if origin in (dict, Mapping) and isinstance(value, dict):
        return {key: _drop_nulls_in(item, args[1]) for key, item in value.items()}
    return value
