"""``featureGates``: the current reference's ``name`` / ``name=true`` / ``name=false`` syntax and per-gate defaults,
through the real config loader."""

from __future__ import annotations

import textwrap

import pytest

from epp.config.feature_gates import GATE_DEFAULTS, FeatureGateError, enabled_gates, parse_feature_gates
from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.flowcontrol import FlowController, LegacyAdmission
from epp.flowcontrol.build import build_admission
from epp.framework.registry import Registry
from epp.runtime.builtins import default_registry

HEAD = "plugins:\n- type: queue-scorer\n"


@pytest.fixture
def registry() -> Registry:
    return default_registry()


def _gates(registry: Registry, entries: str) -> frozenset[str]:
    text = HEAD + textwrap.dedent(entries)
    return build_pipeline(*load_raw(text, "t.yaml"), registry).feature_gates


@pytest.mark.parametrize(("entries", "flow_control"), [
    ("featureGates: [flowControl]\n", True),
    ("featureGates: [flowControl=true]\n", True),
    ("featureGates: ['flowControl= TRUE ']\n", True),
    ("featureGates: [flowControl=1]\n", True),
    ("featureGates: [flowControl=t]\n", True),
    ("featureGates: [flowControl=false]\n", False),
    ("featureGates: [flowControl=F]\n", False),
    ("featureGates: [flowControl=0]\n", False),
    ("featureGates: [flowControl, flowControl=false]\n", False),  # the last entry wins
    ("featureGates: [flowControl=false, flowControl]\n", True),
    ("", False),  # the registered default
], ids=["bare", "true", "padded-upper", "one", "t", "false", "F", "zero", "last-false", "last-bare", "omitted"])
def test_flow_control_gate_forms(registry: Registry, entries: str, flow_control: bool) -> None:
    assert ("flowControl" in _gates(registry, entries)) is flow_control


def test_default_on_gate_is_on_unless_turned_off(registry: Registry) -> None:
    assert "haPopulateNonLeaderDatastore" in _gates(registry, "")
    off = _gates(registry, "featureGates: [haPopulateNonLeaderDatastore=false]\n")
    assert "haPopulateNonLeaderDatastore" not in off


@pytest.mark.parametrize(("entries", "words"), [
    ("featureGates: [warpDrive]\n", ["warpDrive", "unknown or unregistered", "t.yaml:3"]),
    ("featureGates: [warpDrive=true]\n", ["'warpDrive'", "unknown or unregistered"]),
    ("featureGates: [flowControl=yes]\n", ["yes is not a valid value for the feature gate flowControl"]),
    ("featureGates: [flowControl=]\n", ["is not a valid value for the feature gate flowControl"]),
    ("featureGates: [' flowControl']\n", ["' flowControl'", "unknown"]),  # the name is not trimmed
], ids=["unknown", "unknown-with-value", "bad-value", "empty-value", "untrimmed-name"])
def test_bad_entries_fail_naming_the_gate(registry: Registry, entries: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        _gates(registry, entries)
    text = f"{info.value} {info.value.source}:{info.value.line}"
    for word in words:
        assert word in text
    assert info.value.field == "featureGates"


def test_parse_applies_defaults_then_entries_in_order() -> None:
    values = parse_feature_gates(["flowControl", "dataLayer=true", "dataLayer=false"])
    assert values == {**GATE_DEFAULTS, "flowControl": True, "dataLayer": False}
    assert enabled_gates([]) == frozenset(n for n, on in GATE_DEFAULTS.items() if on)
    with pytest.raises(FeatureGateError):
        parse_feature_gates(["flowControl=maybe"])


@pytest.mark.parametrize(("entries", "kind"), [
    ("featureGates: [flowControl=true]\n", FlowController),
    ("featureGates: [flowControl=false]\n", LegacyAdmission),
], ids=["on", "off"])
def test_gate_value_selects_the_admission_controller(registry: Registry, entries: str, kind: type) -> None:
    pipeline = build_pipeline(*load_raw(HEAD + entries, "t.yaml"), registry)
    ctrl = build_admission(pipeline.flow_control, pipeline.feature_gates, pipeline.saturation_detector, None)
    assert isinstance(ctrl, kind)
