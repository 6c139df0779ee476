"""Config validation as strict as the reference's: what JSON cannot carry, duplicate keys, runaway nesting, Go-style
type strictness, references to plugins of the wrong kind, flow-control refs, default pickers, and errors that name
the plugin and line. Real YAML text goes through load_raw/build_pipeline/load_config and ``epp check-config``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from epp.config.loader import DataLayerSpec, DataSourceSpec, build_pipeline, config_error_text, load_config, load_raw
from epp.datalayer import scrape_settings
from epp.errors import ConfigError
from epp.framework.registry import Registry
from epp.runtime.builtins import default_registry

HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return default_registry(entry_points=False)


def _build(text: str, registry: Registry):  # type: ignore[no-untyped-def]
    return build_pipeline(*load_raw(HEAD + textwrap.dedent(text), "t.yaml"), registry)


def _error(text: str, registry: Registry) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _build(text, registry)
    return info.value


def _weight(value: str) -> str:
    return f"""
        plugins: [{{type: queue-scorer}}]
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: queue-scorer
            weight: {value}
        """


# 1. Numbers JSON cannot carry --------------------------------------------------------------------------------------

NON_FINITE = [
    ("nan-weight", _weight(".nan"), ["profile 'default'", "pluginRef 'queue-scorer'", "weight", ".nan", "t.yaml:9"]),
    ("inf-weight", _weight(".inf"), ["pluginRef 'queue-scorer'", ".inf", "t.yaml:9"]),
    ("1e400-weight", _weight("1e400"), ["pluginRef 'queue-scorer'", "1e400", "not a finite number"]),
    ("minus-inf-parameter", """
        plugins:
        - type: utilization-detector
          parameters: {kvCacheUtilThreshold: -.inf}
        """, ["plugin 'utilization-detector'", "parameter 'kvCacheUtilThreshold'", "-.inf", "t.yaml:6"]),
    ("nan-in-flow-control", """
        flowControl:
          tenants:
            a: {weight: .NaN}
        """, ["flowControl.tenants.a.weight", "not a finite number", "t.yaml:6"]),
    ("huge-int-parameter", """
        plugins:
        - type: max-score-picker
          parameters: {maxNumOfEndpoints: 99999999999999999999999999}
        """, ["plugin 'max-score-picker'", "maxNumOfEndpoints", "outside the signed 64-bit range", "t.yaml:6"]),
    ("huge-negative-int-anywhere", """
        flowControl: {maxRequests: -9223372036854775809}
        """, ["flowControl.maxRequests", "outside the signed 64-bit range"]),
]


@pytest.mark.parametrize("text,needles", [(t, n) for _, t, n in NON_FINITE], ids=[i for i, _, _ in NON_FINITE])
def test_numbers_json_cannot_carry_are_errors(text: str, needles: list[str], registry: Registry) -> None:
    message = str(_error(text, registry))
    for needle in needles:
        assert needle in message, message


def test_int64_bounds_and_negative_weights_are_accepted(registry: Registry) -> None:
    pipeline = _build(_weight("-1.5") + "flowControl: {maxRequests: 9223372036854775807}\n", registry)
    assert [w.weight for w in pipeline.scheduler.profiles["default"].scorers] == [-1.5]
    assert pipeline.flow_control.max_requests == 2**63 - 1
    assert "x-1.5" in pipeline.describe()


def test_exponent_floats_read_as_numbers_like_the_reference(registry: Registry) -> None:
    pipeline = _build(_weight("2e0"), registry)
    assert pipeline.scheduler.profiles["default"].scorers[0].weight == 2.0


# 2. Not UTF-8 ------------------------------------------------------------------------------------------------------

def test_non_utf8_file_is_a_config_error(tmp_path: Path, registry: Registry) -> None:
    bad = tmp_path / "binary.yaml"
    bad.write_bytes(HEAD.encode() + b"plugins:\n- type: queue-\xff\n")
    with pytest.raises(ConfigError, match="not UTF-8 text") as info:
        load_config(bad, registry)
    assert info.value.line == 4 and "binary.yaml:4" in str(info.value)


# 3. Runaway nesting and recursive aliases --------------------------------------------------------------------------

def test_absurdly_deep_nesting_is_a_config_error(registry: Registry) -> None:
    deep = "[" * 5000 + "]" * 5000
    error = _error(f"plugins:\n- type: queue-scorer\n  parameters: {{x: {deep}}}\n", registry)
    assert "nested more than 64 levels" in str(error) and error.line == 5


def test_nesting_within_the_limit_still_parses(registry: Registry) -> None:
    error = _error("plugins:\n- type: queue-scorer\n  parameters: {x: " + "[" * 60 + "]" * 60 + "}\n", registry)
    assert "'x' is not a known parameter" in str(error)  # reached the plugin, not the YAML limit


def test_recursive_alias_is_a_config_error(registry: Registry) -> None:
    error = _error("""
        plugins:
        - &a
          type: queue-scorer
          parameters: {x: *a}
        """, registry)
    assert "recursive YAML alias" in str(error) and "plugin 'queue-scorer'" in str(error)
    assert error.plugin == "queue-scorer" and error.line == 7  # where the alias is used


def test_aliases_expanding_past_the_depth_limit_are_a_config_error(registry: Registry) -> None:
    chain = "\n".join(f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 70))
    with pytest.raises(ConfigError, match="nested more than 64 levels"):
        load_raw(f"a0: &a0 [1]\n{chain}\n", "t.yaml")


# 4. Duplicate keys -------------------------------------------------------------------------------------------------

def test_duplicate_top_level_key_names_the_key_and_both_lines(registry: Registry) -> None:
    error = _error("""
        plugins:
        - type: queue-scorer
        plugins:
        - type: kv-cache-utilization-scorer
        """, registry)
    assert "duplicate key 'plugins'" in str(error) and "first at line 4" in str(error) and error.line == 6


def test_duplicate_parameter_key_names_the_plugin(registry: Registry) -> None:
    error = _error("""
        plugins:
        - name: pk
          type: max-score-picker
          parameters:
            maxNumOfEndpoints: 1
            maxNumOfEndpoints: 2
        """, registry)
    assert "plugin 'pk' (type: max-score-picker)" in str(error) and "duplicate key 'maxNumOfEndpoints'" in str(error)
    assert error.plugin == "pk" and error.line == 9


# 5. Go encoding/json type strictness -------------------------------------------------------------------------------

STRICT = [
    ("string-for-int", "{type: max-score-picker, parameters: {maxNumOfEndpoints: '2'}}", "maxNumOfEndpoints"),
    ("bool-for-int", "{type: max-score-picker, parameters: {maxNumOfEndpoints: true}}", "maxNumOfEndpoints"),
    ("fraction-for-int", "{type: max-score-picker, parameters: {maxNumOfEndpoints: 2.5}}", "maxNumOfEndpoints"),
    ("string-for-float", "{type: utilization-detector, parameters: {kvCacheUtilThreshold: '0.5'}}",
     "kvCacheUtilThreshold"),
    ("int-for-string", "{type: label-selector-filter, parameters: {matchLabels: {app: 1}}}", "matchLabels.app"),
]


@pytest.mark.parametrize("plugin,needle", [(p, n) for _, p, n in STRICT], ids=[i for i, _, _ in STRICT])
def test_parameters_are_not_coerced(plugin: str, needle: str, registry: Registry) -> None:
    error = _error(f"plugins:\n- {plugin}\n", registry)
    assert needle in str(error) and error.line == 4


@pytest.mark.parametrize("value", ["true", "'2'"])
def test_weight_is_not_coerced(value: str, registry: Registry) -> None:
    error = _error(_weight(value), registry)
    assert "profile 'default', pluginRef 'queue-scorer': field 'weight'" in str(error)
    assert error.plugin == "queue-scorer" and error.line == 9


def test_flow_control_fields_are_not_coerced(registry: Registry) -> None:
    error = _error("flowControl:\n  priorityBands:\n  - {priority: '1'}\n", registry)
    assert "priorityBands.0.priority" in str(error)


def test_json_conversions_stay_accepted(registry: Registry) -> None:
    pipeline = _build("""
        plugins:
        - type: utilization-detector
          parameters: {kvCacheUtilThreshold: 1, queueDepthThreshold: 7}
        - type: metrics-data-source
          parameters: {scheme: https}
        - type: prefix-cache-scorer
          parameters: {mode: estimate}
        - type: queue-scorer
        schedulingProfiles:
        - name: default
          plugins:
          - {pluginRef: queue-scorer, weight: 2}
          - {pluginRef: prefix-cache-scorer}
        saturationDetector: {pluginRef: utilization-detector}
        """, registry)
    assert pipeline.saturation_detector.params.kv_cache_util_threshold == 1.0
    assert pipeline.handle.plugin("metrics-data-source").params.scheme == "https"
    assert [w.weight for w in pipeline.scheduler.profiles["default"].scorers] == [2.0, 1.0]


# 6. References to a plugin of the wrong kind -----------------------------------------------------------------------

WRONG_KIND = [
    ("parser", "parser: {pluginRef: queue-scorer}", "parser.pluginRef", "not a parser", 4),
    ("saturation-detector", "saturationDetector: {pluginRef: queue-scorer}", "saturationDetector.pluginRef",
     "not a saturation detector", 4),
    ("data-source", "dataLayer: {sources: [{pluginRef: queue-scorer}]}", "dataLayer.sources.0.pluginRef",
     "not a data source", 4),
    ("extractor", "dataLayer: {sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: queue-scorer}]}]}",
     "dataLayer.sources.0.extractors.0.pluginRef", "not an extractor", 4),
]


@pytest.mark.parametrize("section,field,kind,line", [w[1:] for w in WRONG_KIND], ids=[w[0] for w in WRONG_KIND])
def test_reference_to_the_wrong_kind_of_plugin_fails_at_load(section: str, field: str, kind: str, line: int,
                                                             registry: Registry) -> None:
    error = _error(f"plugins: [{{type: queue-scorer}}, {{type: metrics-data-source}}]\n{section}\n", registry)
    assert field in str(error) and kind in str(error) and "'queue-scorer' (type: queue-scorer)" in str(error)
    assert error.plugin == "queue-scorer" and error.line == line


def test_scrape_settings_rejects_a_non_source_instead_of_turning_metrics_off(registry: Registry) -> None:
    pipeline = _build("plugins: [{type: queue-scorer}]\n", registry)
    pipeline.config.data_layer = DataLayerSpec(sources=[DataSourceSpec(pluginRef="queue-scorer")])
    with pytest.raises(ConfigError, match="is not a data source"):
        scrape_settings(pipeline.config, pipeline.handle, registry)


# 7. Flow-control policy refs resolve at load time ------------------------------------------------------------------

def test_bad_flow_control_policy_ref_fails_at_load_with_its_line(registry: Registry) -> None:
    error = _error("""
        featureGates: [flowControl]
        flowControl:
          priorityBands:
          - priority: 0
            orderingPolicyRef: nope-policy
        """, registry)
    assert "orderingPolicyRef" in str(error) and "nope-policy" in str(error) and error.line == 8


def test_flow_control_refs_resolve_to_configured_policy_plugins(registry: Registry) -> None:
    pipeline = _build("""
        featureGates: [flowControl]
        plugins: [{type: edf-ordering-policy, name: my-edf}]
        flowControl:
          defaultPriorityBand: {orderingPolicyRef: my-edf}
        """, registry)
    assert pipeline.flow_control.default_priority_band.ordering_policy_ref == "my-edf"


def test_flow_control_ref_to_a_non_policy_plugin_fails(registry: Registry) -> None:
    error = _error("""
        featureGates: [flowControl]
        plugins: [{type: queue-scorer}]
        flowControl: {usageLimitPolicyPluginRef: queue-scorer}
        """, registry)
    assert "usageLimitPolicyPluginRef" in str(error) and "not a usage limit policy" in str(error)
    assert error.line == 6


# 8. Default picker -------------------------------------------------------------------------------------------------

def test_profile_without_picker_reuses_the_first_declared_picker(registry: Registry) -> None:
    pipeline = _build("""
        plugins:
        - type: queue-scorer
        - type: weighted-random-picker
          name: wr
        - type: random-picker
        - type: disagg-profile-handler
        schedulingProfiles:
        - {name: decode, plugins: [{pluginRef: queue-scorer}]}
        - {name: prefill, plugins: [{pluginRef: queue-scorer}]}
        """, registry)
    pickers = {name: prof.picker.name for name, prof in pipeline.scheduler.profiles.items()}
    assert pickers == {"decode": "wr", "prefill": "wr"}
    assert pipeline.handle.first_of_type("max-score-picker") is None


def test_max_score_picker_is_created_once_when_no_picker_is_declared(registry: Registry) -> None:
    pipeline = _build("""
        plugins: [{type: queue-scorer}, {type: disagg-profile-handler}]
        schedulingProfiles:
        - {name: decode, plugins: [{pluginRef: queue-scorer}]}
        - {name: prefill, plugins: [{pluginRef: queue-scorer}]}
        """, registry)
    pickers = [prof.picker for prof in pipeline.scheduler.profiles.values()]
    assert pickers[0] is pickers[1] and pickers[0].type_name == "max-score-picker"


# 9. Profile names --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry", ["{name: '', plugins: [{pluginRef: queue-scorer}]}",
                                   "{plugins: [{pluginRef: queue-scorer}]}"], ids=["empty", "missing"])
def test_profile_without_a_name_is_an_error(entry: str, registry: Registry) -> None:
    error = _error(f"plugins: [{{type: queue-scorer}}]\nschedulingProfiles:\n- {entry}\n", registry)
    assert "schedulingProfiles[0] is missing a name" in str(error) and error.line == 5


# 10. Errors name the plugin ----------------------------------------------------------------------------------------

def test_unknown_type_names_the_plugin_and_points_at_the_type(registry: Registry) -> None:
    error = _error("plugins:\n- name: foo\n  type: bogus-scorer\n", registry)
    assert "plugin 'foo'" in str(error) and "'bogus-scorer' is not registered" in str(error)
    assert error.plugin == "foo" and error.line == 5


@pytest.mark.parametrize("entry,words", [("{name: foo}", "plugin 'foo' is missing a type"),
                                         ("{name: foo, type: ''}", "plugin 'foo' is missing a type"),
                                         ("{parameters: {}}", "plugins[0] is missing a type")])
def test_missing_type_names_the_plugin(entry: str, words: str, registry: Registry) -> None:
    error = _error(f"plugins:\n- {entry}\n", registry)
    assert words in str(error) and error.line == 4


def test_printed_error_adds_the_plugin_when_the_message_lacks_it() -> None:
    error = ConfigError("boom", plugin="p1", line=3, source="f.yaml")
    assert config_error_text(error) == "f.yaml:3: boom (plugin 'p1')"
    assert config_error_text(ConfigError("plugin 'p1' is odd", plugin="p1")) == "plugin 'p1' is odd"
    assert config_error_text(ConfigError("no plugin here")) == "no plugin here"


# 11. Comment-only files --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["# only a comment\n", "\n# a\n  # b\n", "null\n", "---\n"])
def test_document_with_only_comments_or_null_is_an_error(text: str) -> None:
    with pytest.raises(ConfigError, match="an empty file means the default config"):
        load_raw(text, "t.yaml")


@pytest.mark.parametrize("text", ["", "  \n\n\t\n", "\ufeff\n"])
def test_empty_or_whitespace_text_is_the_default_config(text: str, registry: Registry) -> None:
    pipeline = build_pipeline(*load_raw(text, "t.yaml"), registry)
    weights = {w.scorer.type_name: w.weight for w in pipeline.scheduler.profiles["default"].scorers}
    assert weights == {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3}


# The command line --------------------------------------------------------------------------------------------------

CLI_BAD = [
    ("binary.yaml", b"\xff\xfe\x00garbage", "not UTF-8 text"),
    ("dup.yaml", (HEAD + "plugins: []\nplugins: []\n").encode(), "duplicate key 'plugins'"),
    ("nan.yaml", (HEAD + textwrap.dedent(_weight(".nan"))).encode(), "not a finite number"),
    ("huge.yaml", (HEAD + "plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 1" + "0" * 30
                   + "}\n").encode(), "outside the signed 64-bit range"),
    ("deep.yaml", (HEAD + "plugins: " + "[" * 3000 + "]" * 3000 + "\n").encode(), "nested more than 64 levels"),
    ("fc.yaml", (HEAD + "featureGates: [flowControl]\nflowControl:\n  priorityBands:\n  - {priority: 0, "
                 "orderingPolicyRef: nope-policy}\n").encode(), "nope-policy"),
    ("comments.yaml", b"# nothing here\n", "an empty file means the default config"),
]


def test_check_config_reports_bad_files_without_a_traceback(tmp_path: Path) -> None:
    for name, content, needle in CLI_BAD:
        path = tmp_path / name
        path.write_bytes(content)
        res = subprocess.run([sys.executable, "-m", "epp.cli.main", "check-config", str(path)], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 2, (name, res.stderr)
        assert res.stderr.startswith(f"error: {path}"), (name, res.stderr)
        assert needle in res.stderr and "Traceback" not in res.stderr, (name, res.stderr)


def test_serve_reports_a_non_utf8_config_like_check_config(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    res = subprocess.run([sys.executable, "-m", "epp.cli.main", "serve", "--config", str(path), "--grpc-port", "-1",
                          "--health-port", "-1", "--metrics-port", "-1"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "not UTF-8 text" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_billion_laughs_aliases_are_a_config_error_not_a_hang() -> None:
    """Nine aliases of nine aliases ... nine levels deep expand to 9**9 values: refused once the expansion passes
    MAX_NODES instead of building all 387 million of them."""
    from epp.config.yaml_lines import MAX_NODES

    lines = ['a0: &a0 ["x"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    text = "\n".join(lines) + "\nplugins: []\n"
    with pytest.raises(ConfigError, match=f"more than {MAX_NODES} values"):
        load_raw(text, "laughs.yaml")
