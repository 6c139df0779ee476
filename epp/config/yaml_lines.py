"""YAML loading as the reference does it (YAML read as JSON data), remembering the line of every mapping key and
sequence item, for errors that cite lines.

:func:`load_yaml` returns JSON data only: dicts with string keys, lists, strings, bools, None, integers in the
signed 64-bit range and finite floats. The reference converts YAML to JSON before decoding it strictly, so
anything JSON cannot carry is a :class:`~epp.errors.ConfigError`: ``.nan``, ``.inf`` and ``1e400`` (which YAML
reads as infinity), larger integers, ``!!binary`` scalars. So are duplicate keys in a mapping, nesting deeper than
:data:`MAX_DEPTH` levels and recursive aliases. Timestamps stay the text they were written as, as the reference's
YAML library leaves them when it decodes into untyped data. A whole-number float becomes an integer (``2.0`` reads
as ``2``), as the reference's YAML-to-JSON step writes it, so it suits an integer field there and here. Merge keys
(``<<: *anchor``, or a list of anchors) are expanded as the reference's YAML library expands them; since it decodes
strictly, a key that a merge brings in cannot be set again.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any, Callable

import yaml

from epp.errors import ConfigError

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
_MERGE_TAG = "tag:yaml.org,2002:merge"


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
                mark = event.start_mark  # the parser marks every event it emits; None only for hand-made ones
                raise ConfigError(f"the YAML is nested more than {MAX_DEPTH} levels deep", source=source,
                                  line=mark.line + 1 if mark is not None else None)
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
        """A mapping's JSON object with merge keys (``<<``) expanded in place. A key seen twice is a problem, a key
        that a merge also brings in included: the reference's YAML library, decoding strictly, rejects a key that is
        already set, wherever it came from."""
        out: dict[str, Any] = {}
        merged: set[str] = set()
        for key_node, value_node, merge_line in self.entries(node, path, inner, None):
            key = str(self.construct(key_node, path))
            line = merge_line or key_node.start_mark.line + 1
            if key in out:
                why = ": a key that a merge key ('<<') brings in cannot be set again (the reference's YAML " \
                    "decoding is strict)" if key in merged or merge_line else ""
                self.note(path + (key,), f"duplicate key '{key}' (first at line {self.smap.lines[path + (key,)]})"
                          f"{why}", line=line)
                continue
            if merge_line:
                merged.add(key)
            self.smap.lines[path + (key,)] = line
            out[key] = self.convert(value_node, path + (key,), inner)
        return out

    def entries(self, node: yaml.MappingNode, path: Path, inner: tuple[int, ...],
                merge_line: int | None) -> list[tuple[yaml.Node, yaml.Node, int | None]]:
        """``node``'s (key, value, merge line) entries in document order, each merge key replaced by the entries of
        the mapping or mappings it names (recursively). The merge line is None for a key written in ``node`` itself,
        else the line of the merge key in ``node`` that brought it in (where errors about it point)."""
        out: list[tuple[yaml.Node, yaml.Node, int | None]] = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                out.append((key_node, value_node, merge_line))
                continue
            line = merge_line or key_node.start_mark.line + 1
            for source in self.merge_sources(value_node, path, line):
                self.nodes += len(source.value)
                if id(source) in inner or self.nodes > MAX_NODES:
                    self.note(path, "a recursive YAML alias (the value contains itself)" if id(source) in inner
                              else f"the YAML expands to more than {MAX_NODES} values (aliases included)", line=line)
                    return out
                out.extend(self.entries(source, path, inner + (id(source),), line))
        return out

    def merge_sources(self, node: yaml.Node, path: Path, line: int) -> list[yaml.MappingNode]:
        """The mappings a merge key's value names: one mapping or a list of them; anything else is a problem."""
        if isinstance(node, yaml.MappingNode):
            return [node]
        if isinstance(node, yaml.SequenceNode) and all(isinstance(item, yaml.MappingNode) for item in node.value):
            return list(node.value)
        self.note(path, "a merge key ('<<') takes a mapping or a list of mappings", line=line)
        return []

    def scalar(self, node: yaml.ScalarNode, path: Path) -> Any:
        """A scalar's JSON value; numbers JSON cannot carry and non-JSON types are problems."""
        if node.tag == _TIMESTAMP_TAG:
            return node.value
        value = self.construct(node, path)
        problem = _json_problem(value, node.value)
        if problem is not None:
            self.note(path, problem)
        return _as_json_number(value)

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


def _as_json_number(value: Any) -> Any:
    """A whole-number float as the integer the reference's YAML-to-JSON step writes for it (Go's ``json.Marshal``
    prints ``2.0`` as ``2``, so ``2.0`` decodes into an integer field), when that integer fits in 64 bits; any
    other value unchanged. Go prints the shortest digits that read back as the float, as Python's ``repr`` does."""
    if not isinstance(value, float) or not math.isfinite(value) or not value.is_integer() or abs(value) >= 1e21:
        return value
    whole = int(Decimal(repr(value)))
    return whole if _INT64[0] <= whole <= _INT64[1] else value


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

