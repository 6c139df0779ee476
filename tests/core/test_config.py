"""EndpointPickerConfig loading: the real fixture configs, the reference's defaulting, and named errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from epp.config.loader import build_pipeline, load_config, load_raw
from epp.errors import ConfigError
from epp.framework.registry import Registry
from epp.runtime.builtins import default_registry

FIXTURES = Path(__file__).parent.parent / "fixtures"
CONFIGS = Path(__file__).parent.parent.parent / "config"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return default_registry()


def _build(text: str, registry: Registry):  # type: ignore[no-untyped-def]
    return build_pipeline(*load_raw(textwrap.dedent(text), "test.yaml"), registry)


LOADS = [
    "configs/gie/integration_default-config.yaml",
    "configs/llmd/HEAD_epp-config.yaml",
    "configs/llmd/HEAD_epp-estimate-prefix-cache-config.yaml",
    "configs/llmd/HEAD_pd-epp-config.yaml",
    "configs/llmd/HEAD_sim-pd-epp-config.yaml",
    "configs/llmd/v0.3.0_epp-config.yaml",
    "configs/llmd/v0.3.0_epp-estimate-prefix-cache-config.yaml",
    "configs/llmd/v0.3.0_sim-epp-config.yaml",
    "configs/llmd/v0.3.0_pd-epp-config.yaml",
    "configs/llmd/v0.3.0_sim-pd-epp-config.yaml",
    "conformance-configs/hermetic-default.yaml",
    "conformance-configs/hermetic-datalayer.yaml",
    "conformance-configs/passthrough-parser.yaml",
    "conformance-configs/request-attribute-reporter.yaml",
    "configs/gie/integration_request-attribute-reporter-config.yaml",
    "configs/llmd/HEAD_epp-precise-prefix-cache-config.yaml",
    "configs/llmd/HEAD_sim-epp-no-hit-lru.yaml",
    "configs/llmd/v0.3.0_epp-precise-prefix-cache-config.yaml",
]

# (file, the plugin type the error must name) -- SOURCES.md: "fail cleanly" naming the type EPP lacks.
FAILS = [
    ("configs/gie/integration_datalayer-config.yaml", "mock-metrics-source"),
    ("configs/llmd/v0.3.0_sim-epp-kvcache-config.yaml", "prefix-cache-scorer"),
]


@pytest.mark.parametrize("rel", LOADS, ids=[Path(p).name for p in LOADS])
def test_fixture_config_loads(rel: str, registry: Registry) -> None:
    pipeline = load_config(FIXTURES / rel, registry)
    assert pipeline.scheduler.profiles
    for prof in pipeline.scheduler.profiles.values():
        assert prof.picker is not None
    assert pipeline.describe()


@pytest.mark.parametrize("rel,culprit", FAILS, ids=[Path(p).name for p, _ in FAILS])
def test_fixture_config_fails_cleanly_naming_the_type(rel: str, culprit: str, registry: Registry) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(FIXTURES / rel, registry)
    assert culprit in str(info.value)
    assert rel.split("/")[-1] in str(info.value)  # the file is named
    assert info.value.line is not None


def test_every_shipped_config_loads(registry: Registry) -> None:
    names = sorted(p.name for p in CONFIGS.glob("*.yaml"))
    assert {"default.yaml", "prefix-aware.yaml", "pd-disaggregation.yaml", "cost-model.yaml", "cost-model-fit.yaml",
            "kv-capacity.yaml", "pd-cost-model.yaml"} <= set(names)
    for name in names:
        assert load_config(CONFIGS / name, registry).scheduler.profiles, name


def test_pd_fixture_wires_disaggregation(registry: Registry) -> None:
    pipeline = load_config(FIXTURES / "configs/llmd/HEAD_pd-epp-config.yaml", registry)
    sched = pipeline.scheduler
    assert set(sched.profiles) == {"prefill", "decode"}
    assert sched.handler.type_name == "disagg-profile-handler"
    decode = sched.profiles["decode"]
    assert [f.type_name for f in decode.filters] == ["decode-filter"]
    assert {w.scorer.type_name: w.weight for w in decode.scorers} == {"prefix-cache-scorer": 2, "queue-scorer": 1}
    assert any(p.type_name == "approx-prefix-cache-producer" for p in sched.producers)


def test_no_config_is_reference_default(registry: Registry) -> None:
    pipeline = load_config(None, registry)
    prof = pipeline.scheduler.profiles["default"]
    weights = {w.scorer.type_name: w.weight for w in prof.scorers}
    assert weights == {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3}
    assert prof.picker.type_name == "max-score-picker"
    assert pipeline.scheduler.handler.type_name == "single-profile-handler"
    assert pipeline.parser.type_name == "openai-parser"
    assert pipeline.saturation_detector.type_name == "utilization-detector"


def test_no_profiles_puts_every_plugin_in_a_default_profile(registry: Registry) -> None:
    pipeline = _build("""
        apiVersion: inference.networking.x-k8s.io/v1alpha1
        kind: EndpointPickerConfig
        plugins:
        - type: decode-filter
        - type: queue-scorer
        - type: random-picker
        """, registry)
    prof = pipeline.scheduler.profiles["default"]
    assert [f.name for f in prof.filters] == ["decode-filter"]
    assert [(w.scorer.name, w.weight) for w in prof.scorers] == [("queue-scorer", 1.0)]
    assert prof.picker.type_name == "random-picker"


def test_named_plugins_and_parameters_resolve(registry: Registry) -> None:
    pipeline = _build("""
        apiVersion: llm-d.ai/v1alpha1
        kind: EndpointPickerConfig
        plugins:
        - name: picker3
          type: max-score-picker
          parameters: {maxNumOfEndpoints: 3}
        - type: queue-scorer
        schedulingProfiles:
        - name: only
          plugins:
          - pluginRef: queue-scorer
            weight: 0.5
          - pluginRef: picker3
        """, registry)
    prof = pipeline.scheduler.profiles["only"]
    assert prof.picker.name == "picker3" and prof.picker.params.max_num_of_endpoints == 3
    assert '"maxNumOfEndpoints":3' in pipeline.describe()


BAD = [
    ("unknown-type", """
        plugins: [{type: no-such-scorer}]
        """, ["no-such-scorer", "test.yaml:2"]),
    ("unknown-parameter", """
        plugins:
        - type: token-load-scorer
          parameters: {queueThresholdTokens: 5, bogus: 1}
        """, ["token-load-scorer", "bogus", "is not a known parameter", "test.yaml:4"]),
    ("bad-parameter-type", """
        plugins:
        - name: mp
          type: max-score-picker
          parameters: {maxNumOfEndpoints: many}
        """, ["'mp'", "maxNumOfEndpoints", "test.yaml:5"]),
    ("two-profile-handlers", """
        plugins: [{type: single-profile-handler}, {type: disagg-profile-handler, name: h2}, {type: queue-scorer}]
        """, ["only one profile handler", "single-profile-handler", "h2"]),
    ("single-handler-two-profiles", """
        plugins: [{type: single-profile-handler}, {type: queue-scorer}]
        schedulingProfiles:
        - {name: a, plugins: [{pluginRef: queue-scorer}]}
        - {name: b, plugins: [{pluginRef: queue-scorer}]}
        """, ["single-profile-handler", "exactly one", "found 2"]),
    ("two-profiles-no-handler", """
        plugins: [{type: queue-scorer}]
        schedulingProfiles:
        - {name: a, plugins: [{pluginRef: queue-scorer}]}
        - {name: b, plugins: [{pluginRef: queue-scorer}]}
        """, ["profile handler"]),
    ("dangling-pluginref", """
        plugins: [{type: queue-scorer}]
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: queue-scorer
          - pluginRef: kv-scorer-typo
        """, ["kv-scorer-typo", "pluginRef", "test.yaml:7"]),
    ("duplicate-name", """
        plugins: [{type: queue-scorer}, {type: queue-scorer}]
        """, ["duplicate plugin name 'queue-scorer'"]),
    ("unknown-top-level-field", """
        plugins: [{type: queue-scorer}]
        schedulingProfile: []
        """, ["schedulingProfile", "is not a known field", "test.yaml:3"]),
    ("unknown-feature-gate", """
        featureGates: [warpDrive]
        """, ["warpDrive"]),
    ("bad-api-version", """
        apiVersion: v1
        """, ["apiVersion"]),
    ("two-pickers", """
        plugins: [{type: max-score-picker}, {type: random-picker}]
        schedulingProfiles:
        - {name: default, plugins: [{pluginRef: max-score-picker}, {pluginRef: random-picker}]}
        """, ["two pickers", "random-picker"]),
    ("invalid-yaml", """
        plugins: [type: queue-scorer
        """, ["invalid YAML"]),
]


@pytest.mark.parametrize("text,needles", [(t, n) for _, t, n in BAD], ids=[i for i, _, _ in BAD])
def test_bad_config_names_the_culprit(text: str, needles: list[str], registry: Registry) -> None:
    with pytest.raises(ConfigError) as info:
        _build(text, registry)
    for needle in needles:
        assert needle in str(info.value)


def test_check_config_cli_exit_codes(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "epp.cli.main", "check-config", str(CONFIGS / "pd-disaggregation.yaml")],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "disagg-profile-handler" in ok.stdout and "prefill-filter" in ok.stdout and "x2" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugins:\n- type: queue-scorer\n  parameters: {nope: 1}\n")
    res = subprocess.run([sys.executable, "-m", "epp.cli.main", "check-config", str(bad)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2
    assert "nope" in res.stderr and "bad.yaml:3" in res.stderr and "Traceback" not in res.stderr


def test_dangling_data_layer_reference_names_it_with_its_line(registry: Registry) -> None:
    with pytest.raises(ConfigError) as info:
        _build("""
            plugins: [{type: queue-scorer}, {type: metrics-data-source}]
            dataLayer:
              sources:
              - pluginRef: metrics-data-source
                extractors: [{pluginRef: core-extractor-typo}]
            """, registry)
    assert "core-extractor-typo" in str(info.value) and "test.yaml:6" in str(info.value)
