"""InferenceObjective and InferenceModelRewrite state (``epp.framework.objectives``): precedence, weighted targets, parsing,
and the Director applying them to requests (priority, target model, the rewrite-decision metric)."""

from __future__ import annotations

import random
from collections import Counter

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.framework.objectives import (
    ModelRewrite,
    ModelRewrites,
    Objectives,
    RewriteRule,
    RewriteTarget,
    parse_model_rewrite,
    parse_objective,
    pool_ref_matches,
)
from epp.metrics.families import EppMetrics
from epp.runtime.builtins import default_registry
from epp.scheduling.director import Director


def rule(*models: str, targets: tuple[tuple[str, int | None], ...] = (("t", None),)) -> RewriteRule:
    return RewriteRule(frozenset(models), tuple(RewriteTarget(m, w) for m, w in targets))


def only_target(store: ModelRewrites, model: str) -> tuple[str, str] | None:
    decision = store.rule_for(model)
    if decision is None:
        return None
    return decision.rewrite_name, decision.rule.targets[0].model


# -- precedence ------------------------------------------------------------------------------------------------


def test_exact_match_beats_an_older_generic_rule() -> None:
    store = ModelRewrites()
    store.set(ModelRewrite("generic", 100.0, (rule(targets=(("fallback", None),)),)))
    store.set(ModelRewrite("exact", 200.0, (rule("llama", targets=(("llama-v2", None),)),)))
    assert only_target(store, "llama") == ("exact", "llama-v2")
    assert only_target(store, "mistral") == ("generic", "fallback")


def test_the_oldest_resource_wins_and_its_first_matching_rule() -> None:
    store = ModelRewrites()
    store.set(ModelRewrite("new", 300.0, (rule("llama", targets=(("from-new", None),)),)))
    store.set(ModelRewrite("old", 100.0, (rule("other", targets=(("x", None),)),
                                          rule("llama", targets=(("first", None),)),
                                          rule("llama", targets=(("second", None),)))))
    assert only_target(store, "llama") == ("old", "first")
    store.delete("old")
    assert only_target(store, "llama") == ("new", "from-new")
    assert store.rule_for("other") is None


def test_equal_creation_times_are_ordered_by_name() -> None:
    store = ModelRewrites()
    store.replace_all([ModelRewrite("b", 5.0, (rule("m", targets=(("from-b", None),)),)),
                       ModelRewrite("a", 5.0, (rule("m", targets=(("from-a", None),)),))])
    assert only_target(store, "m") == ("a", "from-a")


def test_a_rule_matches_any_of_its_models_and_replace_all_forgets_the_rest() -> None:
    store = ModelRewrites()
    store.set(ModelRewrite("r", 1.0, (rule("a", "b", targets=(("ab", None),)),)))
    assert only_target(store, "a") == only_target(store, "b") == ("r", "ab")
    store.replace_all([ModelRewrite("s", 2.0, (rule("c"),))])
    assert store.rule_for("a") is None and len(store) == 1


# -- weighted targets ------------------------------------------------------------------------------------------


def test_targets_are_drawn_by_weight() -> None:
    r = rule(targets=(("a", 90), ("b", 10)))
    rng = random.Random(7)
    counts = Counter(r.choose(rng) for _ in range(10_000))
    assert set(counts) == {"a", "b"}
    assert 0.87 < counts["a"] / 10_000 < 0.93


def test_targets_without_weights_are_drawn_uniformly() -> None:
    r = rule(targets=(("a", None), ("b", None), ("c", None)))
    rng = random.Random(3)
    counts = Counter(r.choose(rng) for _ in range(9_000))
    assert all(2_700 < counts[m] < 3_300 for m in "abc")


def test_an_unweighted_target_beside_weighted_ones_is_never_drawn() -> None:
    r = rule(targets=(("weighted", 1), ("unweighted", None)))
    rng = random.Random(1)
    assert {r.choose(rng) for _ in range(500)} == {"weighted"}


def test_a_rule_without_targets_chooses_nothing() -> None:
    assert RewriteRule(frozenset({"m"}), ()).choose(random.Random()) is None


# -- objectives ------------------------------------------------------------------------------------------------


def test_objective_priorities() -> None:
    objectives = Objectives()
    objectives.set("interactive", 10)
    objectives.set("unset", None)
    assert objectives.priority("interactive") == 10
    assert objectives.priority("unset") == 0
    assert objectives.priority("unknown") is None and objectives.priority(None) is None
    objectives.replace_all({"batch": -1})
    assert objectives.priority("interactive") is None and objectives.priority("batch") == -1


# -- parsing the Kubernetes objects ----------------------------------------------------------------------------


def test_parse_objective_and_pool_ref() -> None:
    obj = {"metadata": {"name": "chat"}, "spec": {"priority": 3, "poolRef": {"name": "pool"}}}
    assert parse_objective(obj) == ("chat", 3)
    assert parse_objective({"metadata": {"name": "x"}, "spec": {}}) == ("x", None)
    assert pool_ref_matches(obj, "pool")  # the group defaults to inference.networking.k8s.io
    assert not pool_ref_matches(obj, "other")
    assert not pool_ref_matches({"spec": {"poolRef": {"name": "pool", "group": "example.com"}}}, "pool")
    with pytest.raises(ValueError, match="spec.priority must be an integer"):
        parse_objective({"metadata": {"name": "x"}, "spec": {"priority": "high"}})


def test_parse_model_rewrite_reads_rules_in_order_and_the_creation_time() -> None:
    obj = {"metadata": {"name": "canary", "creationTimestamp": "2026-01-02T03:04:05Z"},
           "spec": {"poolRef": {"name": "pool"}, "futureField": True, "rules": [
               {"matches": [{"model": {"type": "Exact", "value": "llama"}}],
                "targets": [{"modelRewrite": "llama-v1", "weight": 90}, {"modelRewrite": "llama-v2", "weight": 10}]},
               {"targets": [{"modelRewrite": "default-model"}]}]}}
    parsed = parse_model_rewrite(obj)
    assert parsed.name == "canary" and parsed.created == 1767323045.0
    assert parsed.rules[0] == rule("llama", targets=(("llama-v1", 90), ("llama-v2", 10)))
    assert parsed.rules[1] == rule(targets=(("default-model", None),))


@pytest.mark.parametrize(("spec", "message"), [
    ({"rules": [{"matches": [{"model": {"value": ""}}]}]}, r"spec.rules\[0\].matches\[0\].model.value"),
    ({"rules": [{"matches": [{"model": {"type": "Prefix", "value": "l"}}]}]}, "only Exact"),
    ({"rules": [{"targets": [{"weight": 1}]}]}, r"targets\[0\].modelRewrite"),
    ({"rules": [{"targets": [{"modelRewrite": "m", "weight": 2_000_000}]}]}, r"targets\[0\].weight"),
    ({"rules": "all"}, "spec.rules must be a list"),
])
def test_parse_model_rewrite_names_the_unusable_field(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_model_rewrite({"metadata": {"name": "bad"}, "spec": spec})


# -- the Director ----------------------------------------------------------------------------------------------


FLOW_CONFIG = """\
plugins:
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
flowControl:
  objectives: {interactive: 5, batch: -1}
"""


def director_with(datastore: Datastore) -> tuple[Director, CollectorRegistry]:
    pipeline = build_pipeline(*load_raw(FLOW_CONFIG), default_registry())
    registry = CollectorRegistry()
    fc = pipeline.flow_control
    assert fc is not None
    director = Director(pipeline, datastore, metrics=EppMetrics(registry), priorities=fc.priority_for,
                        rng=random.Random(0))
    return director, registry


def body(model: str) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})


def test_director_takes_the_cluster_objective_before_the_config_mapping() -> None:
    datastore = Datastore()
    datastore.objectives.set("interactive", 20)
    director, _ = director_with(datastore)
    parse = director.parse
    assert parse("/v1/chat/completions", body("m"), {"x-gateway-inference-objective": "interactive"}).priority == 20
    assert parse("/v1/chat/completions", body("m"), {"x-gateway-inference-objective": "batch"}).priority == -1
    assert parse("/v1/chat/completions", body("m"), {"x-gateway-inference-objective": "nope"}).priority == 0
    assert parse("/v1/chat/completions", body("m"), {}).priority == 0


def test_director_rewrites_the_target_model_and_counts_the_decision() -> None:
    datastore = Datastore()
    datastore.rewrites.set(ModelRewrite("canary", 1.0, (rule("llama", targets=(("llama-v2", None),)),)))
    director, registry = director_with(datastore)
    # A matching rule wins over the rewrite header, as in the reference.
    request = director.parse("/v1/chat/completions", body("llama"), {"x-gateway-model-name-rewrite": "by-header"})
    assert (request.model, request.target_model) == ("llama", "llama-v2")
    other = director.parse("/v1/chat/completions", body("mistral"), {"x-gateway-model-name-rewrite": "by-header"})
    assert other.target_model == "by-header"
    text = generate_latest(registry).decode()
    assert ('inference_extension_model_rewrite_decisions_total{model_name="llama",model_rewrite_name="canary",'
            'target_model="llama-v2"} 1.0') in text
