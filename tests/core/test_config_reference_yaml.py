"""Configs the reference loads must load here too: YAML merge keys, null values, whole-number floats for integers,
and weights on non-scorers; and an auto-created producer's bad parameters are blamed on the plugins that gave them.
Real YAML text goes through load_raw/build_pipeline and ``epp check-config``."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.framework.registry import Registry
from epp.runtime.builtins import default_registry

HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return default_registry(entry_points=False)


def _text(text: str) -> str:
    """``text`` after the two header lines, so its first line is line 3."""
    return HEAD + textwrap.dedent(text).lstrip("\n")


def _build(text: str, registry: Registry):  # type: ignore[no-untyped-def]
    return build_pipeline(*load_raw(_text(text), "t.yaml"), registry)


def _error(text: str, registry: Registry) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _build(text, registry)
    return info.value


# 1. Merge keys (go-yaml expands them; its strict mode rejects a key set twice) -------------------------------------

def test_merge_key_copies_an_anchored_mapping(registry: Registry) -> None:
    pipeline = _build("""
        plugins:
        - type: prefix-cache-scorer
          parameters: &pc
            blockSizeTokens: 32
            maxPrefixBlocksToMatch: 128
        - type: approx-prefix-cache-producer
          parameters:
            <<: *pc
            lruCapacityPerServer: 1000
        """, registry)
    params = pipeline.handle.plugin("approx-prefix-cache-producer").params
    assert (params.block_size_tokens, params.max_prefix_blocks_to_match, params.lru_capacity_per_server) == \
        (32, 128, 1000)


def test_merge_key_takes_a_list_of_mappings(registry: Registry) -> None:
    pipeline = _build("""
        plugins:
        - type: prefix-cache-scorer
          parameters: &blocks {blockSizeTokens: 32}
        - type: approx-prefix-cache-producer
          parameters:
            <<: [*blocks, {lruCapacityPerServer: 1000}]
        """, registry)
    params = pipeline.handle.plugin("approx-prefix-cache-producer").params
    assert (params.block_size_tokens, params.lru_capacity_per_server) == (32, 1000)


def test_error_in_a_merged_key_points_at_the_merge_key(registry: Registry) -> None:
    error = _error("""
        plugins:
        - type: prefix-cache-scorer
          parameters: &pc {blockSizeTokens: 32, mode: estimate}
        - type: approx-prefix-cache-producer
          parameters:
            <<: *pc
        """, registry)
    assert "plugin 'approx-prefix-cache-producer'" in str(error) and "'mode' is not a known parameter" in str(error)
    assert error.line == 8


def test_keys_after_a_merge_keep_their_own_lines(registry: Registry) -> None:
    error = _error("""
        plugins:
        - type: prefix-cache-scorer
          parameters: &pc {blockSizeTokens: 32}
        - type: approx-prefix-cache-producer
          parameters:
            <<: *pc
            lruCapacityPerServer: lots
        """, registry)
    assert "lruCapacityPerServer" in str(error) and error.line == 9


@pytest.mark.parametrize("parameters", [
    "{<<: *pc, blockSizeTokens: 16}",
    "{blockSizeTokens: 16, <<: *pc}",
    "{<<: [*pc, {blockSizeTokens: 16}]}",
], ids=["explicit-after", "explicit-before", "two-merged"])
def test_a_key_set_by_a_merge_and_again_is_a_duplicate_as_in_the_reference(parameters: str,
                                                                            registry: Registry) -> None:
    error = _error(f"""
        plugins:
        - type: prefix-cache-scorer
          parameters: &pc {{blockSizeTokens: 32}}
        - type: approx-prefix-cache-producer
          parameters: {parameters}
        """, registry)
    assert "duplicate key 'blockSizeTokens'" in str(error) and "merge key" in str(error) and error.line == 7


@pytest.mark.parametrize("value,needle", [
    ("5", "takes a mapping or a list of mappings"),
    ("[*pc, 5]", "takes a mapping or a list of mappings"),
], ids=["scalar", "list-with-scalar"])
def test_merge_of_a_non_mapping_is_an_error(value: str, needle: str, registry: Registry) -> None:
    error = _error(f"""
        plugins:
        - type: prefix-cache-scorer
          parameters: &pc {{blockSizeTokens: 32}}
        - type: approx-prefix-cache-producer
          parameters:
            <<: {value}
        """, registry)
    assert needle in str(error) and error.line == 8


def test_merge_of_an_enclosing_mapping_is_a_recursive_alias_error(registry: Registry) -> None:
    with pytest.raises(ConfigError, match="recursive YAML alias"):
        load_raw(HEAD + "flowControl: &fc\n  priorityBands:\n  - <<: *fc\n", "t.yaml")


def test_merges_doubling_at_each_level_are_an_error_not_a_hang() -> None:
    lines = ["flowControl:", "  l0: &l0 {a: 1}"]
    lines += [f"  l{i}: &l{i} {{<<: [*l{i - 1}, *l{i - 1}]}}" for i in range(1, 40)]  # 2**39 merged entries
    with pytest.raises(ConfigError, match="duplicate key 'a'"):
        load_raw(HEAD + "\n".join(lines) + "\n", "t.yaml")


# 2. Null leaves a field at its default (Go's encoding/json ignores null for a value field) --------------------------

def test_feature_gates_with_every_entry_commented_out_load(registry: Registry) -> None:
    pipeline = _build("""
        featureGates:
        #- flowControl
        plugins:
        - type: queue-scorer
        """, registry)
    assert pipeline.feature_gates == frozenset({"haPopulateNonLeaderDatastore"})  # only the default-on gate


@pytest.mark.parametrize("text", [
    "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n",
    "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: x\n  plugins:\n",
    "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: x\n  plugins:\n  - pluginRef: queue-scorer\n"
    "    weight:\n",
    "plugins: [{type: queue-scorer}]\nflowControl: {maxRequests: null}\n",
], ids=["profiles", "profile-plugins", "weight", "flow-control-field"])
def test_null_config_fields_are_unset(text: str, registry: Registry) -> None:
    pipeline = _build(text, registry)
    assert all(prof.picker is not None for prof in pipeline.scheduler.profiles.values())


def test_null_parameters_keep_their_defaults(registry: Registry) -> None:
    pipeline = _build("""
        plugins:
        - type: load-aware-scorer
          parameters: {threshold: null}
        - type: max-score-picker
          parameters: {maxNumOfEndpoints: null}
        """, registry)
    assert pipeline.handle.plugin("load-aware-scorer").params.threshold == 128
    assert pipeline.handle.plugin("max-score-picker").params.max_num_of_endpoints == 1


def test_null_for_an_unknown_parameter_is_still_unknown(registry: Registry) -> None:
    error = _error("plugins:\n- type: max-score-picker\n  parameters: {bogus: null}\n", registry)
    assert "'bogus' is not a known parameter" in str(error) and error.plugin == "max-score-picker"


# 3. Whole-number floats read as integers (the reference's YAML-to-JSON step writes 2.0 as 2) ------------------------

@pytest.mark.parametrize("value,expected", [("2.0", 2), ("3e0", 3), ("1.0e+1", 10)])
def test_whole_number_float_is_accepted_for_an_integer(value: str, expected: int, registry: Registry) -> None:
    pipeline = _build(f"plugins:\n- type: max-score-picker\n  parameters: {{maxNumOfEndpoints: {value}}}\n", registry)
    count = pipeline.handle.plugin("max-score-picker").params.max_num_of_endpoints
    assert count == expected and isinstance(count, int)


@pytest.mark.parametrize("value", ["2.5", "1e20"])
def test_fraction_or_out_of_range_float_for_an_integer_names_plugin_and_field(value: str, registry: Registry) -> None:
    error = _error(f"plugins:\n- name: mp\n  type: max-score-picker\n  parameters: {{maxNumOfEndpoints: {value}}}\n",
                   registry)
    assert "plugin 'mp'" in str(error) and "maxNumOfEndpoints" in str(error)
    assert error.plugin == "mp" and error.field == "maxNumOfEndpoints" and error.line == 6


def test_large_whole_float_stays_accepted_for_a_float_field(registry: Registry) -> None:
    pipeline = _build("plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: p\n  plugins:\n"
                      "  - {pluginRef: queue-scorer, weight: 1e20}\n", registry)
    assert pipeline.scheduler.profiles["p"].scorers[0].weight == 1e20


# 4. A weight on a non-scorer is ignored with a warning, as the reference ignores it --------------------------------

def test_weight_on_a_picker_is_ignored_with_one_warning(registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="epp.config.loader"):
        pipeline = _build("""
            plugins: [{type: queue-scorer}, {type: random-picker, name: rp}]
            schedulingProfiles:
            - name: main
              plugins:
              - {pluginRef: queue-scorer, weight: 3}
              - {pluginRef: rp, weight: 2}
            """, registry)
    prof = pipeline.scheduler.profiles["main"]
    assert prof.picker is not None and prof.picker.name == "rp"
    assert [(w.scorer.name, w.weight) for w in prof.scorers] == [("queue-scorer", 3.0)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "profile 'main'" in warnings[0] and "plugin 'rp'" in warnings[0] and "t.yaml:8" in warnings[0]


# 5. An auto-created producer's bad parameters are blamed on the configured plugins that gave them -------------------

PD_MIX = """
    plugins:
    - type: prefill-header-handler
    - type: prefix-cache-scorer
      parameters:
        blockSizeTokens: 16
    - type: prefill-filter
    - type: decode-filter
    - type: pd-profile-handler
      parameters:
        threshold: 10
        hashBlockSize: 64
    schedulingProfiles:
    - name: prefill
      plugins: [{pluginRef: prefill-filter}, {pluginRef: prefix-cache-scorer}]
    - name: decode
      plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer}]
    """


def test_auto_created_producer_error_names_the_configured_plugins_and_lines(registry: Registry) -> None:
    error = _error(PD_MIX, registry)
    text = str(error)
    assert text.startswith("t.yaml:13: ")  # pd-profile-handler's hashBlockSize, the parameter blamed
    assert "'pd-profile-handler'" in text and "'prefix-cache-scorer'" in text and "automatically" in text
    assert "'blockSizeTokens' from plugin 'prefix-cache-scorer' at line 7" in text
    assert "hashBlockSize (v0.3, characters) and blockSizeTokens cannot both be set" in text
    assert error.plugin == "pd-profile-handler" and error.field == "hashBlockSize"


def test_check_config_prints_the_auto_producer_error_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "pdmix.yaml"
    path.write_text(_text(PD_MIX))
    res = subprocess.run([sys.executable, "-m", "epp.cli.main", "check-config", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2
    assert f"{path}:13:" in res.stderr and "pd-profile-handler" in res.stderr and "Traceback" not in res.stderr


def test_consumers_disagreeing_on_a_producer_parameter_point_at_the_second_one(registry: Registry) -> None:
    error = _error("""
        plugins:
        - type: prefix-cache-scorer
          parameters: {blockSizeTokens: 16}
        - name: other
          type: prefix-cache-scorer
          parameters:
            blockSizeTokens: 32
        """, registry)
    assert "plugins 'prefix-cache-scorer' and 'other'" in str(error) and "different values" in str(error)
    assert error.plugin == "other" and error.line == 9
