"""Every built-in of the plugin groups is registered, documented, strictly parameterised and exports its names."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import plugins.filters
import plugins.parsers
import plugins.pickers
import plugins.producers
import plugins.profiles
import plugins.scorers
from epp.framework import Handle, Params
from plugins.producers.approx_prefix_cache import PRODUCER_TYPE, ApproxPrefixCacheProducer
from plugin_helpers import registry

GROUPS = [plugins.filters, plugins.scorers, plugins.pickers, plugins.profiles, plugins.producers, plugins.parsers]
BUILTINS = [(cls, aliases) for g in GROUPS for cls, aliases in g.BUILTINS]
CLASSES = [cls for cls, _ in BUILTINS]
MODULES = [f"{g.__name__}.{m.name}" for g in GROUPS for m in pkgutil.iter_modules(g.__path__)]
REQUIRED_PARAMS = {"by-label": {"label": "app", "validValues": ["x"]}}


def test_expected_types_and_aliases_are_registered() -> None:
    reg = registry()
    expected = {
        "label-selector-filter", "by-label", "decode-filter", "prefill-filter", "encode-filter",
        "prefix-cache-affinity-filter", "kv-capacity-filter", "queue-scorer", "running-requests-size-scorer",
        "kv-cache-utilization-scorer", "lora-affinity-scorer", "token-load-scorer", "prefix-cache-scorer",
        "session-affinity-scorer", "no-hit-lru-scorer", "load-aware-scorer", "active-request-scorer",
        "batch-headroom-scorer", "max-score-picker", "random-picker", "weighted-random-picker",
        "single-profile-handler", "disagg-profile-handler", "pd-profile-handler", "disagg-headers-handler",
        "prefix-based-pd-decider", "always-disagg-pd-decider", PRODUCER_TYPE, "openai-parser",
        "passthrough-parser"}
    assert expected <= set(reg.types())
    assert {cls.type_name for cls in CLASSES} == expected
    for alias, canonical in [("by-label-selector", "label-selector-filter"), ("kv-cache-scorer",
                             "kv-cache-utilization-scorer"), ("prefill-header-handler", "disagg-headers-handler")]:
        assert reg.resolve(alias) == canonical


@pytest.mark.parametrize("cls", CLASSES, ids=[c.type_name for c in CLASSES])
def test_plugin_class_shape(cls: type) -> None:
    assert issubclass(cls.Params, Params) and cls.Params.model_config.get("extra") == "forbid"
    doc = inspect.getmodule(cls).__doc__ or ""
    assert cls.type_name in doc and "YAML::" in doc, "module docstring must carry the type and a YAML example"
    assert cls.__doc__, "plugin class needs a docstring stating its contract"
    plugin = registry().create(cls.type_name, "instance", REQUIRED_PARAMS.get(cls.type_name), Handle())
    assert plugin.name == "instance" and isinstance(plugin.params, cls.Params)


@pytest.mark.parametrize("cls", [c for c in CLASSES if getattr(c, "consumes", ())],
                         ids=lambda c: c.type_name)
def test_consumers_declare_the_producer_and_valid_producer_params(cls: type) -> None:
    assert cls.consumes == (PRODUCER_TYPE,)
    params = cls.Params.model_validate(REQUIRED_PARAMS.get(cls.type_name, {}))
    raw = cls.producer_params(params)
    assert isinstance(raw, dict)
    ApproxPrefixCacheProducer.Params.model_validate(raw)


@pytest.mark.parametrize("name", MODULES)
def test_module_exports(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(getattr(module, "__all__", ()))
    assert all(hasattr(module, n) for n in exported)
    defined = {n for n, obj in vars(module).items() if not n.startswith("_") and inspect.isclass(obj)
               and getattr(obj, "type_name", None) and obj.__module__ == name and "type_name" in vars(obj)}
    assert defined <= exported, sorted(defined - exported)
