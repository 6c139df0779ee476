"""config/grafana/epp-dashboard.json against the metrics EPP really exports.

The exported series are read from one registry holding every metric owner ``epp serve`` may register (request,
scheduler, pool and data-layer families, flow control, latency prediction, config reload, ext_proc streams, the
KV-block index, the program-aware fairness policy): each family under its sample names (``_total``; ``_bucket``,
``_sum``, ``_count``) with its label names. Checked: the file is a Grafana dashboard whose panel ids are unique and
whose panels do not overlap; every panel and query reads the ``${datasource}`` variable; every metric a PromQL
expression or a ``label_values`` variable names is exported, and every label its selectors, ``by`` clauses and
legends use is one of those metrics' labels.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from epp.config.reload import ReloadMetrics
from epp.datalayer.datastore import Datastore
from epp.extproc.stream_metrics import StreamMetrics
from epp.flowcontrol.metrics import FlowControlMetrics
from epp.kvcache.metrics import IndexCollector
from epp.latency.metrics import LatencyMetrics
from epp.metrics.families import EppMetrics
from epp.plugins.flowcontrol.program_aware import ProgramAwareCollector

DASHBOARD = Path(__file__).resolve().parents[2] / "config" / "grafana" / "epp-dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",),
             "summary": ("", "_sum", "_count"), "unknown": ("",)}

_TOKEN = re.compile(r"""
      (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')
    | (?P<matchers>\{[^}]*\})
    | (?P<range>\[[^\]]*\])
    | (?P<variable>\$\{?\w+\}?)
    | (?P<duration>(?:\d+(?:ms|[smhdwy]))+\b)
    | (?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)
    | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<other>\S)""", re.X)
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = _GROUPING | {"bool", "and", "or", "unless", "offset"}
_MATCHER_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*(\w+)\s*\)")


class _Recording(CollectorRegistry):
    """A registry that keeps its collectors, to read the label names of families that have no series yet."""

    def __init__(self) -> None:
        super().__init__()
        self.collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        super().register(collector)
        self.collectors.append(collector)


def _owners(registry: CollectorRegistry) -> None:
    """Every metric owner EPP registers, on ``registry`` (each as ``epp serve`` builds it)."""
    EppMetrics(registry).attach_pool(Datastore("pool"))
    FlowControlMetrics(registry, "pool")
    LatencyMetrics(registry)
    ReloadMetrics(registry)
    StreamMetrics(registry)
    registry.register(IndexCollector([]))
    registry.register(ProgramAwareCollector([]))


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Sample name -> label names, for every series EPP exports."""
    registry = _Recording()
    _owners(registry)
    out: dict[str, set[str]] = {}
    for collector in registry.collectors:
        # prometheus-client's own wrappers keep their label names on the collector (their families have none
        # until a series exists); MetricFamily objects carry theirs.
        wrapper_labels = set(getattr(collector, "_labelnames", ()))
        for family in collector.collect():
            labels = wrapper_labels | set(getattr(family, "_labelnames", ()))
            labels |= {name for sample in family.samples for name in sample.labels}
            for suffix in _SUFFIXES[family.type]:
                out.setdefault(family.name + suffix, set()).update(labels | ({"le"} if suffix == "_bucket" else set()))
    return out


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(panel title, target) of every query."""
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield panel["title"], target


def parse_promql(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """The selectors of ``expr`` (metric name, labels its matchers use) and the labels of its grouping clauses."""
    tokens = [(m.lastgroup or "", m.group()) for m in _TOKEN.finditer(expr)]
    selectors: list[tuple[str, set[str]]] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if kind == "name" and text in _GROUPING and following[1] == "(":
            i += 2
            while tokens[i][1] != ")":
                if tokens[i][0] == "name":
                    grouping.add(tokens[i][1])
                i += 1
        elif kind == "name" and text not in _KEYWORDS and following[1] not in ("(", "by", "without"):
            # followed by "(" it is a function, by a grouping clause an aggregation: otherwise a metric
            matchers = set(_MATCHER_LABEL.findall(following[1])) if following[0] == "matchers" else set()
            selectors.append((text, matchers))
        i += 1
    return selectors, grouping


@pytest.mark.parametrize("expr, selectors, grouping", [
    ('histogram_quantile(0.99, sum by (le, model_name) (rate(a_bucket{model_name=~"$model"}[$__rate_interval])))',
     [("a_bucket", {"model_name"})], {"le", "model_name"}),
    ("sum(rate(a_total[5m])) / sum without (x) (b) > bool 1e-9", [("a_total", set()), ("b", set())], {"x"}),
    ('count by (build_ref) (c{ name = "on", y!~"by (z)" }) offset 5m', [("c", {"name", "y"})], {"build_ref"}),
], ids=["quantile", "division-number", "strings-and-offset"])
def test_the_promql_reader(expr: str, selectors: list[tuple[str, set[str]]], grouping: set[str]) -> None:
    assert parse_promql(expr) == (selectors, grouping)


def test_it_is_a_grafana_dashboard(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    assert {v["name"]: v["type"] for v in dashboard["templating"]["list"]}["datasource"] == "datasource"
    assert sum(1 for _ in _queries(dashboard)) >= 30


def test_panel_ids_are_unique(dashboard: dict[str, Any]) -> None:
    ids = [panel["id"] for panel in _panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))


def test_panels_fit_the_grid_without_overlapping(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in _panels(dashboard["panels"]):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_every_panel_and_query_reads_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    datasource = next(v for v in dashboard["templating"]["list"] if v["name"] == "datasource")
    assert datasource["query"] == "prometheus"
    for panel in _panels(dashboard["panels"]):
        if panel["type"] != "row":
            assert panel["datasource"] == DATASOURCE, panel["title"]
    for title, target in _queries(dashboard):
        assert target["datasource"] == DATASOURCE, title
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]


def test_queries_name_only_exported_metrics_and_their_labels(dashboard: dict[str, Any],
                                                             exported: dict[str, set[str]]) -> None:
    for title, target in _queries(dashboard):
        selectors, grouping = parse_promql(target["expr"])
        assert selectors, f"{title}: {target['expr']} reads no metric"
        labels: set[str] = set()
        for name, matchers in selectors:
            assert name in exported, f"{title}: EPP exports no {name}"
            assert matchers <= exported[name], f"{title}: {name} has no label {matchers - exported[name]}"
            labels |= exported[name]
        assert grouping <= labels, f"{title}: {target['expr']} groups by {grouping - labels}"
        legend = set(_LEGEND_LABEL.findall(target.get("legendFormat", "")))
        assert legend <= labels, f"{title}: the legend uses {legend - labels}"


def test_variables_read_exported_labels(dashboard: dict[str, Any], exported: dict[str, set[str]]) -> None:
    queries = [v for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert {v["name"] for v in queries} >= {"pool", "model"}
    for variable in queries:
        match = _LABEL_VALUES.fullmatch(variable["query"])
        assert match, variable["query"]
        metric, label = match.groups()
        assert label in exported.get(metric, set()), variable["query"]


def test_pool_and_model_filters_use_the_variables(dashboard: dict[str, Any]) -> None:
    """A panel on a family with a pool label filters by $pool, one with a model_name label by $model."""
    for title, target in _queries(dashboard):
        expr = target["expr"]
        for name, matchers in parse_promql(expr)[0]:
            if name.startswith(("llm_d_epp_average_", "llm_d_epp_std_dev_", "llm_d_epp_ready_endpoints")):
                assert 'name=~"$pool"' in expr, title
            if "inference_pool" in matchers:
                assert 'inference_pool=~"$pool"' in expr, title
            if name.startswith("llm_d_epp_request_") and "model_name" in matchers:
                assert 'model_name=~"$model"' in expr, title
