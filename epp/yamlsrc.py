"""YAML loading as the reference does it (YAML read as JSON data), remembering the line of every mapping key and
sequence item, for errors that cite lines.

:func:`load_yaml` returns JSON data only: dicts with string keys, lists, strings, bools, None, integers in the
signed 64-bit range and finite floats. The reference converts YAML to JSON before decoding it strictly, so
anything JSON cannot carry is a :class:`~epp.errors.ConfigError`: ``.nan``, ``.inf`` and ``1e400`` (which YAML
reads as infinity), larger integers, ``!!binary`` scalars. So are duplicate keys in a mapping, nesting deeper than
:data:`MAX_DEPTH` levels and recursive aliases. Timestamps stay the text they were written as, as the reference's
YAML library leaves them when it decodes into untyped data.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import yaml

from .errors import ConfigError

__all__ = ["SourceMap", "load_yaml", "MAX_DEPTH", "MAX_NODES", "Owner"]

Path = tuple[str | int, ...]
MAX_DEPTH = 64
MAX_NODES = 100_000
"""Values a config may expand to, aliases included (a config has hundreds; "billion laughs" aliases billions)."""
"""The deepest nesting of mappings and sequences accepted (a config needs fewer than ten levels)."""

Owner = Callable[[Any, Path], tuple[str, str | None]]
"""``owner(data, path)`` -> (words naming what sits at ``path``, e.g. "plugin 'x' (type: t): parameter 'p'"; the
name of the plugin it belongs to, or None). Lets YAML-level errors name the plugin the way the caller does."""

_INT64 = (-(2**63), 2**63 - 1)
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, also reading ``1e3``, ``1.5e3`` and ``1e400`` as floats: YAML 1.1 wants a dot and a
    signed exponent, but the reference's YAML library (and YAML 1.2) read them as numbers."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
                              list("-+.0123456789"))


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


def load_yaml(text: str, source: str = "<config>", owner: Owner | None = None) -> tuple[Any, SourceMap]:
    """Parse ``text`` into JSON data plus a :class:`SourceMap`; None for a document that is empty or null.

    Syntax errors and data JSON cannot carry (see the module docstring) raise ConfigError with the line; the
    first such problem in document order is reported, its location worded by ``owner`` when given.
    """
    smap = SourceMap(source)
    node = _compose(text, source)
    if node is None:
        return None, smap
    converter = _Converter(smap)
    data = converter.convert(node, (), ())
    if converter.problem is not None:
        raise converter.error(data, owner or _field_owner)
    return data, smap


def _compose(text: str, source: str) -> yaml.Node | None:
    try:
        _check_depth(text, source)
        return yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(f"invalid YAML: {getattr(exc, 'problem', None) or exc}", source=source,
                          line=mark.line + 1 if mark else None) from exc


def _check_depth(text: str, source: str) -> None:
    """Reject nesting deeper than MAX_DEPTH from the event stream, before the (recursive) composer sees it."""
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(f"the YAML is nested more than {MAX_DEPTH} levels deep", source=source,
                                  line=event.start_mark.line + 1)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _field_owner(data: Any, path: Path) -> tuple[str, str | None]:
    return f"field '{'.'.join(map(str, path))}'", None


class _Converter:
    """Node tree -> JSON data; records the first problem (and goes on, so the caller can name its owner)."""

    def __init__(self, smap: SourceMap) -> None:
        self.smap = smap
        self.problem: tuple[Path, int, str] | None = None
        self.nodes = 0

    def note(self, path: Path, message: str, line: int | None = None) -> None:
        """Remember a problem at ``path`` (on ``line``, by default where ``path`` is written) unless an earlier one
        is already recorded."""
        if self.problem is None:
            self.problem = (path, line if line is not None else self.smap.lines[path], message)

    def error(self, data: Any, owner: Owner) -> ConfigError:
        """The ConfigError for the recorded problem, its location worded by ``owner``."""
        assert self.problem is not None
        path, line, message = self.problem
        what, plugin = owner(data, path)
        return ConfigError(f"{what}: {message}", plugin=plugin, field=".".join(map(str, path)) or None,
                           source=self.smap.source, line=line)

    def convert(self, node: yaml.Node, path: Path, ancestors: tuple[int, ...]) -> Any:
        """The JSON value of ``node`` at ``path``; ``ancestors`` are the ids of the collections enclosing it."""
        self.smap.lines.setdefault(path, node.start_mark.line + 1)
        self.nodes += 1
        if self.nodes > MAX_NODES:
            self.note(path, f"the YAML expands to more than {MAX_NODES} values (aliases included)")
            return None
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, path)
        if id(node) in ancestors:
            self.note(path, "a recursive YAML alias (the value contains itself)")
            return None
        if len(ancestors) >= MAX_DEPTH:
            self.note(path, f"the YAML is nested more than {MAX_DEPTH} levels deep (through aliases)")
            return None
        inner = ancestors + (id(node),)
        if isinstance(node, yaml.MappingNode):
            return self.mapping(node, path, inner)
        return [self.convert(item, path + (i,), inner) for i, item in enumerate(node.value)]

    def mapping(self, node: yaml.MappingNode, path: Path, inner: tuple[int, ...]) -> dict[str, Any]:
        """A mapping's JSON object; a key seen twice is a problem (the reference decodes strictly)."""
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(self.construct(key_node, path))
            if key in out:
                self.note(path + (key,), f"duplicate key '{key}' (first at line {self.smap.lines[path + (key,)]})",
                          line=key_node.start_mark.line + 1)
                continue
            self.smap.lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = self.convert(value_node, path + (key,), inner)
        return out

    def scalar(self, node: yaml.ScalarNode, path: Path) -> Any:
        """A scalar's JSON value; numbers JSON cannot carry and non-JSON types are problems."""
        if node.tag == _TIMESTAMP_TAG:
            return node.value
        value = self.construct(node, path)
        problem = _json_problem(value, node.value)
        if problem is not None:
            self.note(path, problem)
        return value

    def construct(self, node: yaml.Node, path: Path) -> Any:
        """The Python value PyYAML builds for ``node``; an unknown tag or a malformed value is a problem."""
        loader = _Loader("")
        try:
            return loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.note(path, f"invalid YAML value: {getattr(exc, 'problem', None) or exc}",
                      line=node.start_mark.line + 1)
            return None
        finally:
            loader.dispose()


def _json_problem(value: Any, text: str) -> str | None:
    if value is None or isinstance(value, (bool, str)):
        return None
    if isinstance(value, int):
        if _INT64[0] <= value <= _INT64[1]:
            return None
        return f"the integer {text} is outside the signed 64-bit range"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{text} is not a finite number (JSON cannot carry NaN or infinity)"
    return f"a {type(value).__name__} value cannot be represented in JSON"

