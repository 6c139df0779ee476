"""Static endpoints file: load, reload on change, reject malformed edits while keeping the previous set."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from epp.datalayer.static import StaticFileDiscovery, load_endpoints_file, parse_endpoints, parse_endpoints_document
from epp.errors import ConfigError

from ..conftest import eventually

TWO = """\
endpoints:
  - name: pod-a
    address: 127.0.0.1
    port: 8000
    labels: {llm-d.ai/role: decode, tier: 1}
    metricsPort: 9000
    metricsPath: /stats
    engine: sglang
  - name: pod-b
    address: 10.0.0.2
    port: 8001
"""


def write(path: Path, text: str) -> None:
    """Replace the file atomically, as editors and ConfigMap updates do, with a distinct mtime."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_parse_full_entry():
    a, b = parse_endpoints(TWO)
    assert (a.name, a.address, a.port, a.metrics_port, a.metrics_path, a.engine) == (
        "pod-a", "127.0.0.1", 8000, 9000, "/stats", "sglang")
    assert a.labels == {"llm-d.ai/role": "decode", "tier": "1"}
    assert (b.metrics_port, b.metrics_path, b.engine, b.labels) == (None, "/metrics", None, {})
    assert b.hostport == "10.0.0.2:8001"


def test_entry_node_is_kept_for_the_scheduler_extender():
    (a,) = parse_endpoints("endpoints:\n  - {name: a, address: 10.0.0.1, port: 8000, node: gpu-node-1}\n")
    (b,) = parse_endpoints("endpoints:\n  - {name: b, address: 10.0.0.2, port: 8000}\n")
    assert (a.node, b.node) == ("gpu-node-1", "")


def test_reference_file_discovery_entry_with_namespace():
    """llm-d-router's file-discovery entries carry ``namespace`` (and quote the port); the namespace is kept."""
    a, b = parse_endpoints('endpoints:\n  - {name: vllm-0, namespace: llm, address: "10.0.0.1", port: "8000"}\n'
                           '  - {name: vllm-1, address: "10.0.0.2", port: "8000"}\n')
    assert (a.namespace, a.hostport) == ("llm", "10.0.0.1:8000")
    assert b.namespace == ""


@pytest.mark.parametrize("host,address,port", [
    ("10.0.0.5:9090", "10.0.0.5", 9090),
    ("metrics.local:8080", "metrics.local", 8080),
    ("[fd00::5]:9400", "fd00::5", 9400),
], ids=["ipv4", "hostname", "ipv6"])
def test_reference_metrics_host(host, address, port):
    """llm-d-router's file-discovery ``metricsHost`` (host:port scraped for metrics) is accepted and kept."""
    (ep,) = parse_endpoints(f'endpoints: [{{name: a, address: "10.0.0.1", port: "8000", metricsHost: "{host}"}}]')
    assert (ep.metrics_address, ep.metrics_port, ep.hostport) == (address, port, "10.0.0.1:8000")


@pytest.mark.parametrize("host", ["10.0.0.5", "10.0.0.5:", "10.0.0.5:0", "10.0.0.5:99999", "10.0.0.5:x",
                                  "10.0.0.5:9090/metrics", "u@10.0.0.5:9090", ":9090"])
def test_malformed_metrics_host_is_rejected(host):
    with pytest.raises(ConfigError, match="metricsHost.*host:port"):
        parse_endpoints(f'endpoints: [{{name: a, address: h, port: 1, metricsHost: "{host}"}}]')


def test_metrics_host_and_metrics_port_together_are_rejected():
    with pytest.raises(ConfigError, match="both metricsHost and metricsPort"):
        parse_endpoints("endpoints: [{name: a, address: h, port: 1, metricsHost: 'h:2', metricsPort: 3}]")


@pytest.mark.parametrize("text,needle", [
    ("endpoints: [{name: a, address: h}]", "port"),
    ("endpoints: [{name: a, address: h, port: 0}]", "port"),
    ("endpoints: [{name: a, address: h, port: 1, metricport: 2}]", "metricport"),
    ("endpoints: [{name: a, address: h, port: 1}, {name: a, address: h2, port: 2}]", "duplicate"),
    ("endpoints: [{name: a, namespace: x, address: h, port: 1}, {name: a, namespace: y, address: h2, port: 2}]",
     "duplicate endpoint name 'a' .*unique across namespaces"),
    ("endpoints: [{name: a, address: h, port: 1}, {name: b, address: h, port: 1}]", "both h:1"),
    ("endpoints: [{name: a, address: h, port: 1, metricsPath: stats}]", "metricsPath"),
    ("endpoints: {name: a}", "endpoints"),
    ("- a\n- b", "mapping"),
    ("endpoints: [\n  {name: a, address: h, port: 1\n", "YAML"),
    ("servers: []", "servers"),
], ids=["missing-port", "port-zero", "unknown-key", "duplicate", "duplicate-across-namespaces", "same-address",
        "relative-path", "not-a-list", "not-a-mapping", "bad-yaml", "unknown-top-key"])
def test_invalid_documents_name_the_problem(text, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_endpoints(text, "eps.yaml")


def test_empty_file_is_an_empty_pool():
    assert parse_endpoints("") == []
    assert parse_endpoints("endpoints: []") == []


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_endpoints_file(tmp_path / "missing.yaml")


async def test_start_loads_and_marks_synced(tmp_path, datastore):
    path = tmp_path / "eps.yaml"
    write(path, TWO)
    disc = StaticFileDiscovery(path, datastore, poll_interval=60)
    await disc.start()
    try:
        assert datastore.synced.is_set()
        assert [ep.name for ep in datastore.endpoints()] == ["pod-a", "pod-b"]
    finally:
        await disc.stop()


async def test_invalid_file_at_start_refuses_to_start(tmp_path, datastore):
    path = tmp_path / "eps.yaml"
    write(path, "endpoints: [{name: a}]")
    with pytest.raises(ConfigError):
        await StaticFileDiscovery(path, datastore).start()
    assert not datastore.synced.is_set()


async def test_reload_keeps_unchanged_endpoints_and_their_inflight_counts(tmp_path, datastore):
    path = tmp_path / "eps.yaml"
    write(path, TWO)
    disc = StaticFileDiscovery(path, datastore, poll_interval=60)
    await disc.start()
    a = datastore.get("pod-a")
    a.add_inflight(100)  # a request is in flight to pod-a during the reload
    changes = []
    datastore.subscribe(lambda added, removed: changes.append(([e.name for e in added], [e.name for e in removed])))

    write(path, TWO.replace("name: pod-b", "name: pod-c") + "    labels: {llm-d.ai/role: prefill}\n")
    assert disc.reload()
    assert datastore.get("pod-a") is a and a.inflight_requests == 1 and a.inflight_tokens == 100
    assert [ep.name for ep in datastore.endpoints()] == ["pod-a", "pod-c"]
    assert changes == [(["pod-c"], ["pod-b"])]

    write(path, TWO.replace("tier: 1", "tier: 2").replace("name: pod-b", "name: pod-c")
          + "    labels: {llm-d.ai/role: prefill}\n")
    assert disc.reload()
    assert datastore.get("pod-a") is a and a.labels["tier"] == "2"  # relabelled in place
    assert len(changes) == 1
    await disc.stop()


async def test_swapping_two_addresses_keeps_both_endpoints_findable_by_address(tmp_path, datastore):
    path = tmp_path / "eps.yaml"
    write(path, "endpoints: [{name: a, address: 10.0.0.1, port: 8000}, {name: b, address: 10.0.0.1, port: 8001}]")
    disc = StaticFileDiscovery(path, datastore, poll_interval=60)
    await disc.start()
    write(path, "endpoints: [{name: a, address: 10.0.0.1, port: 8001}, {name: b, address: 10.0.0.1, port: 8000}]")
    assert disc.reload()
    await disc.stop()
    assert {ep.name: ep.hostport for ep in datastore.endpoints()} == {"a": "10.0.0.1:8001", "b": "10.0.0.1:8000"}
    for ep in datastore.endpoints():
        assert datastore.by_hostport(ep.hostport) is ep
    datastore.remove("a")
    assert datastore.by_hostport("10.0.0.1:8001") is None and datastore.by_hostport("10.0.0.1:8000").name == "b"


async def test_malformed_edit_is_rejected_and_previous_set_stays(tmp_path, datastore, caplog):
    path = tmp_path / "eps.yaml"
    write(path, TWO)
    disc = StaticFileDiscovery(path, datastore, poll_interval=60)
    await disc.start()
    before = list(datastore.endpoints())
    with caplog.at_level(logging.ERROR, logger="epp.datalayer.static"):
        for broken in ("endpoints: [{name: a, address: h", "endpoints: [{name: x, address: h, port: 99999}]"):
            write(path, broken)
            assert not disc.reload()
            assert datastore.endpoints() == before
            assert disc.last_error is not None
        assert not disc.reload()  # same broken content: not reported again
    assert len([r for r in caplog.records if "rejected" in r.getMessage()]) == 2

    path.unlink()  # file deleted: also an error, set kept
    assert not disc.reload() and datastore.endpoints() == before

    write(path, "endpoints: [{name: only, address: 127.0.0.1, port: 1}]")
    assert disc.reload()
    assert [ep.name for ep in datastore.endpoints()] == ["only"] and disc.last_error is None
    await disc.stop()


async def test_touch_without_change_does_nothing(tmp_path, datastore):
    path = tmp_path / "eps.yaml"
    write(path, TWO)
    disc = StaticFileDiscovery(path, datastore, poll_interval=60)
    await disc.start()
    write(path, TWO)
    assert not disc.reload()
    await disc.stop()


async def test_poller_picks_up_changes(tmp_path, datastore):
    path = tmp_path / "eps.yaml"
    write(path, TWO)
    disc = StaticFileDiscovery(path, datastore, poll_interval=0.02)
    await disc.start()
    try:
        write(path, "endpoints: []")
        await eventually(lambda: datastore.endpoints() == [], what="poller applied the new file")
        write(path, "not: [valid")
        await eventually(lambda: disc.last_error is not None, what="poller rejected the broken file")
        write(path, TWO)
        await eventually(lambda: len(datastore.endpoints()) == 2, what="poller applied the fixed file")
    finally:
        await disc.stop()


# -- objectives and model rewrites ---------------------------------------------------------------------------

POLICIES = TWO + """\
inferenceObjectives:
  - name: interactive
    priority: 10
  - name: plain
inferenceModelRewrites:
  - name: canary
    rules:
      - matches: [{model: {value: llama}}, {model: {type: Exact, value: llama-3}}]
        targets: [{modelRewrite: llama-v2, weight: 90}, {modelRewrite: llama-v3, weight: 10}]
  - name: everything-else
    rules:
      - targets: [{modelRewrite: default-model}]
"""


def test_parse_objectives_and_rewrites():
    doc = parse_endpoints_document(POLICIES)
    assert [e.name for e in doc.endpoints] == ["pod-a", "pod-b"]
    assert doc.objectives == {"interactive": 10, "plain": None}
    canary, generic = doc.rewrites
    assert canary.created < generic.created  # file order stands for creation order
    assert canary.rules[0].models == {"llama", "llama-3"}
    assert [(t.model, t.weight) for t in canary.rules[0].targets] == [("llama-v2", 90), ("llama-v3", 10)]
    assert generic.rules[0].models == frozenset()


@pytest.mark.parametrize("tail,needle", [
    ("inferenceObjectives: [{name: a, priority: high}]", r"inferenceObjectives\.0\.priority"),
    ("inferenceObjectives: [{name: a}, {name: a}]", "duplicate objective 'a'"),
    ("inferenceModelRewrites: [{name: r, rules: []}]", r"inferenceModelRewrites\.0\.rules"),
    ("inferenceModelRewrites: [{name: r, rules: [{matches: [{model: {value: m}}]}]}]", "targets"),
    ("inferenceModelRewrites: [{name: r, rules: [{targets: [{modelRewrite: m, weight: 0}]}]}]", "weight"),
    ("inferenceModelRewrites: [{name: r, rules: [{targets: [{modelRewrite: m}], "
     "matches: [{model: {type: Prefix, value: l}}]}]}]", "type"),
    ("inferenceModelRewrites: [{name: r, poolRef: {name: p}, rules: [{targets: [{modelRewrite: m}]}]}]", "poolRef"),
    ("inferenceModelRewrites: [{name: r, rules: [{targets: [{modelRewrite: m}]}]}, "
     "{name: r, rules: [{targets: [{modelRewrite: n}]}]}]", "duplicate rewrite 'r'"),
], ids=["priority-not-int", "duplicate-objective", "no-rules", "no-targets", "weight-zero", "not-exact",
        "pool-ref", "duplicate-rewrite"])
def test_invalid_policies_name_the_problem(tail, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_endpoints_document(TWO + tail + "\n", "eps.yaml")


async def test_reload_applies_objectives_and_rewrites_and_a_bad_edit_keeps_them(tmp_path, datastore):
    path = tmp_path / "eps.yaml"
    write(path, POLICIES)
    disc = StaticFileDiscovery(path, datastore, poll_interval=60)
    await disc.start()
    try:
        assert datastore.objectives.priority("interactive") == 10
        assert datastore.rewrites.rule_for("mistral").rewrite_name == "everything-else"
        write(path, POLICIES.replace("priority: 10", "priority: 20").replace("llama-3}", "llama-4}"))
        assert disc.reload()
        assert datastore.objectives.priority("interactive") == 20
        assert datastore.rewrites.rule_for("llama-4").rewrite_name == "canary"
        assert datastore.rewrites.rule_for("llama-3").rewrite_name == "everything-else"
        write(path, POLICIES.replace("priority: 10", "priority: ten"))
        assert not disc.reload() and "priority" in (disc.last_error or "")
        assert datastore.objectives.priority("interactive") == 20  # the previous version stays in force
        write(path, TWO)
        assert disc.reload()
        assert datastore.objectives.priority("interactive") is None and not datastore.rewrites
    finally:
        await disc.stop()
