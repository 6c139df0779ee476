"""YAML loading that remembers the line of every mapping key and sequence item, for errors that cite lines."""

from __future__ import annotations

from typing import Any

import yaml

from .errors import ConfigError

__all__ = ["SourceMap", "load_yaml"]

Path = tuple[str | int, ...]


class SourceMap:
    """Line numbers (1-based) of YAML nodes by their path, e.g. ``("plugins", 2, "parameters")``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: dict[Path, int] = {}

    def line(self, *path: str | int) -> int | None:
        """The line of ``path`` or of its nearest ancestor that has one."""
        p: Path = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), None)


def load_yaml(text: str, source: str = "<config>") -> tuple[Any, SourceMap]:
    """Parse ``text`` into plain Python data plus a :class:`SourceMap`; YAML syntax errors become ConfigError."""
    smap = SourceMap(source)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(f"invalid YAML: {getattr(exc, 'problem', exc)}", source=source,
                          line=mark.line + 1 if mark else None) from exc
    if node is None:
        return None, smap
    return _convert(node, (), smap), smap


def _convert(node: yaml.Node, path: Path, smap: SourceMap) -> Any:
    smap.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(_scalar(key_node))
            smap.lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _convert(value_node, path + (key,), smap)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, path + (i,), smap) for i, item in enumerate(node.value)]
    return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()
