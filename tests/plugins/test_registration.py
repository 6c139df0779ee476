"""Every built-in of the plugin groups is registered, documented, strictly parameterised and exports its names."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import random
from types import FunctionType

import pytest

import epp.plugins.filters
import epp.plugins.parsers
import epp.plugins.pickers
import epp.plugins.producers
import epp.plugins.profiles
import epp.plugins.requestcontrol
import epp.plugins.scorers
from epp.framework.plugins import CycleState, Handle, Params
from epp.latency import PRODUCER_TYPE as LATENCY_PRODUCER_TYPE
from epp.plugins.producers.approx_prefix_cache import PRODUCER_TYPE, ApproxPrefixCacheProducer

from .helpers import ep, registry, req

GROUPS = [epp.plugins.filters, epp.plugins.scorers, epp.plugins.pickers, epp.plugins.profiles, epp.plugins.producers, epp.plugins.parsers,
          epp.plugins.requestcontrol]
BUILTINS = [(cls, aliases) for g in GROUPS for cls, aliases in g.BUILTINS]
CLASSES = [cls for cls, _ in BUILTINS]
MODULES = [f"{g.__name__}.{m.name}" for g in GROUPS for m in pkgutil.iter_modules(g.__path__)]
REQUIRED_PARAMS = {"by-label": {"label": "app", "validValues": ["x"]}, "token-producer": {"modelName": "m"},
                   "request-attribute-reporter": {"attributes": [{"key": {"name": "cost"},
                                                                  "expression": "usage.prompt_tokens"}]},
                   "utilization-filter": {"conditions": [{"metric": "waiting-queue", "maxValue": 8}]},
                   "endpoint-attribute-filter": {"attribute": "queue_depth",
                                                 "algorithm": {"type": "topK", "topK": {"k": 2}}},
                   "endpoint-attribute-scorer": {"attributeKey": "queue_depth",
                                                 "algorithm": {"type": "linear_lower_is_better"}},
                   "header-label-affinity-scorer": {"headerName": "x-zone", "labelKey": "zone"},
                   "session-id-producer": {"headerName": "x-session-id"}}


def test_expected_types_and_aliases_are_registered() -> None:
    reg = registry()
    expected = {
        "label-selector-filter", "by-label", "decode-filter", "prefill-filter", "encode-filter",
        "prefix-cache-affinity-filter", "kv-capacity-filter", "queue-scorer", "running-requests-size-scorer",
        "kv-cache-utilization-scorer", "lora-affinity-scorer", "token-load-scorer", "prefix-cache-scorer",
        "session-affinity-scorer", "no-hit-lru-scorer", "load-aware-scorer", "active-request-scorer",
        "batch-headroom-scorer", "context-length-aware", "max-score-picker", "random-picker", "weighted-random-picker",
        "single-profile-handler", "data-parallel-profile-handler", "disagg-profile-handler", "pd-profile-handler", "disagg-headers-handler",
        "prefix-based-pd-decider", "always-disagg-pd-decider", PRODUCER_TYPE, "openai-parser",
        "passthrough-parser", "anthropic-parser", "vertexai-parser", "vllmhttp-parser", "sglanghttp-parser",
        "vllmgrpc-parser", "sglanggrpc-parser", "precise-prefix-cache-producer", "precise-prefix-cache-scorer",
        "token-producer", "inflight-load-producer", "header-based-testing-filter", "request-attribute-reporter",
        "destination-endpoint-served-verifier", "always-disagg-multimodal-decider", "probabilistic-admitter",
        "latency-scorer", "slo-headroom-tier-filter", "latency-slo-admitter", "predicted-latency-producer",
        "mm-embeddings-cache-producer", "mm-embeddings-cache-scorer",
        "utilization-filter", "endpoint-attribute-filter", "endpoint-attribute-scorer",
        "header-profile-handler", "header-label-affinity-scorer", "session-affinity-filter",
        "session-id-producer", "ttft-cost-scorer"}
    assert expected <= set(reg.types())
    assert {cls.type_name for cls in CLASSES} == expected
    for alias, canonical in [("by-label-selector", "label-selector-filter"), ("kv-cache-scorer",
                             "kv-cache-utilization-scorer"), ("prefill-header-handler", "disagg-headers-handler"),
                             ("tokenizer", "token-producer")]:
        assert reg.resolve(alias) == canonical


@pytest.mark.parametrize("cls", CLASSES, ids=[c.type_name for c in CLASSES])
def test_plugin_class_shape(cls: type) -> None:
    assert issubclass(cls.Params, Params) and cls.Params.model_config.get("extra") == "forbid"
    doc = inspect.getmodule(cls).__doc__ or ""
    assert cls.type_name in doc and "YAML::" in doc, "module docstring must carry the type and a YAML example"
    assert cls.__doc__, "plugin class needs a docstring stating its contract"
    plugin = registry().create(cls.type_name, "instance", REQUIRED_PARAMS.get(cls.type_name), Handle())
    assert plugin.name == "instance" and isinstance(plugin.params, cls.Params)


@pytest.mark.parametrize("cls", [c for c in CLASSES if PRODUCER_TYPE in getattr(c, "consumes", ())],
                         ids=lambda c: c.type_name)
def test_consumers_declare_the_producer_and_valid_producer_params(cls: type) -> None:
    assert set(cls.consumes) <= {PRODUCER_TYPE, LATENCY_PRODUCER_TYPE}
    params = cls.Params.model_validate(REQUIRED_PARAMS.get(cls.type_name, {}))
    raw = cls.producer_params(params)
    assert isinstance(raw, dict)
    ApproxPrefixCacheProducer.Params.model_validate(raw)


@pytest.mark.parametrize("cls", [c for c in CLASSES if LATENCY_PRODUCER_TYPE in getattr(c, "consumes", ())],
                         ids=lambda c: c.type_name)
def test_latency_readers_declare_the_latency_producer_without_parameters_for_it(cls: type) -> None:
    assert cls.consumes[0] == LATENCY_PRODUCER_TYPE
    assert cls.producer_params(cls.Params.model_validate({})) == {}


@pytest.mark.parametrize("name", MODULES)
def test_module_exports(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(getattr(module, "__all__", ()))
    assert all(hasattr(module, n) for n in exported)
    defined = {n for n, obj in vars(module).items() if not n.startswith("_") and inspect.isclass(obj)
               and getattr(obj, "type_name", None) and obj.__module__ == name and "type_name" in vars(obj)}
    assert defined <= exported, sorted(defined - exported)


def _built(cls: type):  # type: ignore[no-untyped-def]
    """``cls`` built with default parameters and bound next to a producer, as the loader would leave it."""
    handle = Handle()
    producer = registry().create(PRODUCER_TYPE, PRODUCER_TYPE, None, handle)
    plugin = registry().create(cls.type_name, "p", REQUIRED_PARAMS.get(cls.type_name), handle)
    handle.add(producer)
    for other in set(getattr(cls, "consumes", ())) - {PRODUCER_TYPE}:  # e.g. mm-embeddings-cache-producer
        handle.add(registry().create(other, other, None, handle))
    handle.add(plugin)
    if hasattr(plugin, "bind"):
        plugin.bind(handle)
    return plugin, producer


SCORERS = [c for c in CLASSES if isinstance(getattr(c, "score", None), FunctionType)]
FILTERS = [c for c in CLASSES if isinstance(getattr(c, "filter", None), FunctionType)]


@pytest.mark.parametrize("cls", SCORERS, ids=lambda c: c.type_name)
def test_scorer_contract_empty_and_unit_interval(cls: type) -> None:
    scorer, producer = _built(cls)
    request = req("shared system prompt " * 20, max_tokens=32)
    assert scorer.score(CycleState(), request, []) == []
    rng = random.Random(3)
    endpoints = [ep(f"e{i}", waiting=rng.randint(0, 200), running=rng.randint(0, 300), kv=rng.random(),
                    inflight=rng.randint(0, 50), inflight_tokens=rng.randint(0, 5_000_000), max_num_seqs=256,
                    max_lora=rng.randint(0, 2)) for i in range(16)]
    producer.add(producer.hashes(request, 64)[:3], endpoints[2])
    cyc = CycleState()
    producer.produce(cyc, request, endpoints)
    scores = scorer.score(cyc, request, endpoints)
    assert len(scores) == len(endpoints) and all(0.0 <= s <= 1.0 for s in scores)


@pytest.mark.parametrize("cls", FILTERS, ids=lambda c: c.type_name)
def test_filter_contract_empty_stays_empty(cls: type) -> None:
    flt, _ = _built(cls)
    assert flt.filter(CycleState(), req(), []) == []
