"""The import layering of ``epp`` and its plugins, read from the source: nothing is imported, the files are parsed.

Every import statement is an edge: top-level ones, those under ``TYPE_CHECKING`` and those inside functions.
``from X import Y`` is an edge to the module ``X.Y`` when there is one, else to ``X``; importing a package is
importing its ``__init__`` (a submodule's import does not add an edge to its parent packages). Relative imports are
resolved; ``plugins/`` is read as ``epp.plugins``, the name it is installed under. Checked:

1. ``LAYER_OF`` puts every module in one of ``LAYERS``; no module imports a module of a higher layer.
2. ``epp.framework`` imports only base modules; nothing imports ``bench``, ``epp_sim`` or a top-level ``plugins``;
   only the composition root ``epp.runtime.builtins`` imports ``epp.plugins``.
3. Plugins import only the contracts, the base modules and ``PLUGIN_HELPERS`` (and each other).
4. There is no import cycle (strongly connected components of the whole graph, Tarjan's algorithm).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (("epp", ROOT / "epp"), ("epp.plugins", ROOT / "plugins"))
"""Each installed package name and the folder it is read from."""

LAYERS = ("base", "contracts", "helpers", "engine", "front ends", "composition", "cli")
"""Lowest first: a module may import its own layer and the ones before it."""

LAYER_OF: dict[str, str] = {
    # "a.b.*" is the package a.b with everything under it, "a.b" one module alone; the most specific entry wins.
    "epp": "base",  # the package's own __init__: its version
    "epp.errors": "base",
    "epp.headers": "base",
    "epp.usage.*": "base",  # token usage read from responses, for both front ends and the parser plugins
    "epp._pb.*": "base",  # generated protobuf messages
    "epp.config.units": "base",  # Go durations and Kubernetes quantities
    "epp.config.schema": "base",  # the config document's models (read by the data layer's wiring too)
    "epp.framework.*": "contracts",
    "epp.datalayer.*": "helpers",
    "epp.metrics.*": "helpers",
    "epp.metrics.auth": "front ends",  # guards the /metrics port the composition serves (TLS, bearer tokens)
    "epp.http1.*": "helpers",
    "epp.kvcache.*": "helpers",
    "epp.tokenization.*": "helpers",
    "epp.latency.*": "helpers",
    "epp.observability.*": "helpers",  # tracing and the access log: the Director and both front ends report to it
    "epp.scheduling.*": "engine",
    "epp.config.*": "engine",
    "epp.flowcontrol.*": "engine",
    "epp.plugins.*": "engine",  # beside the engine: rule 3 bounds what they import, rule 2 who imports them
    "epp.extproc.*": "front ends",
    "epp.gateway.*": "front ends",
    "epp.envoy.*": "front ends",
    "epp.extender.*": "front ends",  # the kube-scheduler extender: reads the pool and the saturation detector
    "epp.runtime.*": "composition",
    "epp.cli.*": "cli",
}

CONTRACTS = "epp.framework.*"
COMPOSITION_ROOT = "epp.runtime.builtins"
OUTSIDE = ("bench", "epp_sim", "plugins")
"""Top-level names no module may import: the benchmarks, the simulator, and ``plugins/`` under its folder name."""

PLUGIN_HELPERS = (
    "epp.kvcache.*", "epp.tokenization.*", "epp.latency.*", "epp.datalayer.models", "epp.datalayer.engines", "epp.datalayer.scraper",
    "epp.datalayer.polling", "epp.datalayer.static", "epp.flowcontrol.policies", "epp.flowcontrol.queues",
    "epp._pb.engines.*",
)
"""What plugins may import besides the contracts and the base modules, as :mod:`epp.framework` documents it: the
KV-block index, prompt ids in process, latency prediction, served models and engine metric specs, what data-source and discovery plugins
configure and run, the flow-control policy contracts and the model servers' gRPC messages."""


@dataclass(frozen=True)
class Import:
    importer: str
    file: Path
    line: int
    target: str

    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


@cache
def modules() -> dict[str, tuple[Path, bool]]:
    """Every module: its dotted name -> (its file, whether it is a package's ``__init__``)."""
    found: dict[str, tuple[Path, bool]] = {}
    for package, folder in SOURCES:
        for file in sorted(folder.rglob("*.py")):
            parts = file.relative_to(folder).with_suffix("").parts
            is_init = parts[-1] == "__init__"
            found[".".join((package, *(parts[:-1] if is_init else parts)))] = (file, is_init)
    return found


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_init: bool) -> list[str]:
    """The modules one import statement of ``importer`` names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: from the importer's package, one level up per extra dot
        package = importer.split(".") if is_init else importer.split(".")[:-1]
        assert node.level - 1 < len(package), f"{importer}: relative import beyond the top-level package"
        base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else base for alias in node.names]


@cache
def imports() -> tuple[Import, ...]:
    """Every import statement's edges, wherever the statement is (module level, TYPE_CHECKING, functions); a
    statement naming one module twice is one edge."""
    found: dict[Import, None] = {}
    for name, (file, is_init) in modules().items():
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update((Import(name, file, node.lineno, t), None) for t in _targets(node, name, is_init))
    return tuple(found)


def internal_imports() -> list[Import]:
    """The edges between two of our modules, without self-imports."""
    return [i for i in imports() if i.target in modules() and i.target != i.importer]


def matches(module: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        package = pattern[:-2]
        return module == package or module.startswith(package + ".")
    return module == pattern


def layer_of(module: str) -> str | None:
    """The layer of the most specific ``LAYER_OF`` entry naming ``module`` (an exact name beats a package)."""
    named = [p for p in LAYER_OF if matches(module, p)]
    if not named:
        return None
    return LAYER_OF[max(named, key=lambda p: (not p.endswith(".*"), len(p)))]


def rank(module: str) -> int:
    layer = layer_of(module)
    assert layer is not None, f"{module} has no layer in LAYER_OF"
    return LAYERS.index(layer)


def is_base_or_contract(module: str) -> bool:
    return layer_of(module) in ("base", "contracts")


def described(edges: list[Import], rule: str) -> str:
    """``rule``, then ``file:line (importer) imports target`` per edge: what a failure prints."""
    return "\n".join([rule, *(f"  {i.where()} ({i.importer}) imports {i.target}" for i in edges)])


# -- the walk itself -------------------------------------------------------------------------------------------

def test_the_walk_sees_both_trees_and_resolves_relative_imports() -> None:
    names = modules()
    assert {"epp", "epp.errors", "epp.framework.plugins", "epp.plugins", "epp.runtime.builtins"} <= set(names)
    assert not [n for n in names if n.startswith(("plugins.", "bench."))]

    def resolved(statement: str, importer: str) -> list[str]:
        node = ast.parse(statement).body[0]
        assert isinstance(node, ast.ImportFrom)
        return _targets(node, importer, modules()[importer][1])

    assert resolved("from ..framework import plugins, Handle", "epp.config.loader") == [
        "epp.framework.plugins", "epp.framework"]
    assert resolved("from . import wiring", "epp.config") == ["epp.config.wiring"]
    assert resolved("from .scorers import register", "epp.plugins") == ["epp.plugins.scorers"]


def test_every_module_has_a_layer_and_the_most_specific_entry_wins() -> None:
    assert [m for m in modules() if layer_of(m) is None] == []
    assert set(LAYER_OF.values()) <= set(LAYERS)
    assert (layer_of("epp.config.units"), layer_of("epp.config.loader"), layer_of("epp.config")) == (
        "base", "engine", "engine")


# -- 1. layers -------------------------------------------------------------------------------------------------

def test_no_module_imports_a_higher_layer() -> None:
    upward = [i for i in internal_imports() if rank(i.target) > rank(i.importer)]
    assert not upward, described(upward, "imports of a higher layer (" + " < ".join(LAYERS) + ")")


# -- 2. contracts, outside code, composition root ---------------------------------------------------------------

def test_the_contracts_import_only_base_modules() -> None:
    wrong = [i for i in internal_imports() if matches(i.importer, CONTRACTS) and not is_base_or_contract(i.target)]
    assert not wrong, described(wrong, "epp.framework imports beyond the base modules")


def test_nothing_imports_the_benchmarks_the_simulator_or_top_level_plugins() -> None:
    wrong = [i for i in imports() if i.target.split(".")[0] in OUTSIDE]
    assert not wrong, described(wrong, "imports of " + ", ".join(OUTSIDE))


def test_only_the_composition_root_imports_the_plugins() -> None:
    wrong = [i for i in imports() if matches(i.target, "epp.plugins.*")
             and not matches(i.importer, "epp.plugins.*") and i.importer != COMPOSITION_ROOT]
    assert not wrong, described(wrong, f"imports of epp.plugins outside {COMPOSITION_ROOT}")


# -- 3. what plugins import ------------------------------------------------------------------------------------

def test_plugins_import_only_contracts_base_and_helpers() -> None:
    def allowed(target: str) -> bool:
        return (matches(target, "epp.plugins.*") or is_base_or_contract(target)
                or any(matches(target, p) for p in PLUGIN_HELPERS))

    wrong = [i for i in internal_imports() if matches(i.importer, "epp.plugins.*") and not allowed(i.target)]
    assert not wrong, described(wrong, "plugin imports outside the contracts, base and PLUGIN_HELPERS")


# -- 4. cycles -------------------------------------------------------------------------------------------------

def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` with more than one node, iteratively (no recursion
    limit), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = _pop_component(stack, on_stack, node)
                    if len(component) > 1:
                        found.append(sorted(component))
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    return found


def _pop_component(stack: list[str], on_stack: set[str], root: str) -> list[str]:
    component: list[str] = []
    while True:
        node = stack.pop()
        on_stack.discard(node)
        component.append(node)
        if node == root:
            return component


def test_tarjan_finds_cycles_and_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": set()}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["d", "e"]]


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for module in modules():
        graph[module]
    for i in internal_imports():
        graph[i.importer].add(i.target)
    cycles = strongly_connected(graph)
    closing = [i for cycle in cycles for i in internal_imports() if {i.importer, i.target} <= set(cycle)]
    assert not cycles, described(closing, "import cycles (" + "; ".join(" <-> ".join(c) for c in cycles) + ")")
