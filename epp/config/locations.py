"""Words for a place in an ``EndpointPickerConfig``, for error messages: which plugin, profile or field a YAML
path such as ``("plugins", 2, "parameters", "threshold")`` concerns, and the plugin name to report with it."""

from __future__ import annotations

from typing import Any

__all__ = ["config_location"]


def config_location(data: Any, path: tuple) -> tuple[str, str | None]:
    """Words naming the config location ``path`` and the plugin it concerns: the plugin for ``plugins[i]...``,
    the profile and pluginRef for ``schedulingProfiles[i].plugins[j]...``, else the dotted field."""
    if len(path) >= 2 and path[0] == "plugins" and isinstance(path[1], int):
        return _plugin_owner(_mapping_at(data, path[:2]), path[1], path[2:])
    if len(path) >= 2 and path[0] == "schedulingProfiles" and isinstance(path[1], int):
        return _profile_owner(data, path)
    return _field_words(path), None


def _plugin_owner(spec: dict[str, Any], index: int, rest: tuple) -> tuple[str, str | None]:
    type_name, name = _name(spec.get("type")), _name(spec.get("name"))
    name = name or type_name
    words = f"plugins[{index}]" if name is None else f"plugin '{name}'"
    if type_name is not None:
        words += f" (type: {type_name})"
    if rest[:1] == ("parameters",) and len(rest) > 1:
        words += f": parameter '{'.'.join(map(str, rest[1:]))}'"
    elif rest:
        words += f": {_field_words(rest)}"
    return words, name


def _profile_owner(data: Any, path: tuple) -> tuple[str, str | None]:
    profile = _name(_mapping_at(data, path[:2]).get("name"))
    words = f"profile '{profile}'" if profile is not None else f"schedulingProfiles[{path[1]}]"
    rest, plugin = path[2:], None
    if len(rest) >= 2 and rest[0] == "plugins" and isinstance(rest[1], int):
        plugin = _name(_mapping_at(data, path[:4]).get("pluginRef"))
        words += f", pluginRef '{plugin}'" if plugin is not None else f", plugins[{rest[1]}]"
        rest = rest[2:]
    return (f"{words}: {_field_words(rest)}" if rest else words), plugin


def _field_words(path: tuple) -> str:
    return f"field '{'.'.join(map(str, path))}'"


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _mapping_at(data: Any, path: tuple) -> dict[str, Any]:
    """The mapping at ``path`` in ``data`` ({} when there is none)."""
    for key in path:
        if isinstance(data, dict):
            data = data.get(key)
        elif isinstance(data, list) and isinstance(key, int) and 0 <= key < len(data):
            data = data[key]
        else:
            return {}
    return data if isinstance(data, dict) else {}
