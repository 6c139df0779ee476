"""latency-scorer: which bucket it scores (positive, idle, deficit buckets), the scores within a bucket (least/most,
the weights, the range re-normalisation), the composite fallback without predictions, and its parameters (the
reference's plugin_test.go cases, plus exact values worked from its formula)."""

from __future__ import annotations

import pytest

from epp.errors import ConfigError
from epp.framework.plugins import CycleState, Handle, Scorer
from epp.latency import PRODUCER_TYPE
from epp.plugins.producers.approx_prefix_cache import PRODUCER_TYPE as PREFIX_PRODUCER_TYPE
from epp.plugins.producers.approx_prefix_cache import PrefixMatch
from epp.plugins.scorers.latency import LatencyScorer, bucket_scores, select_bucket

from .helpers import ep, make, registry, req
from .latency import StandInLatencyProducer, cycle_with, info


def scorer(**raw: object) -> LatencyScorer:
    return make(LatencyScorer, dict(raw))


def scores(plugin: LatencyScorer, cycle: CycleState, *names: str, **metrics: dict[str, float]) -> dict[str, float]:
    endpoints = [ep(n, **metrics.get(n, {})) for n in names]  # type: ignore[arg-type]
    return dict(zip(names, plugin.score(cycle, req(), endpoints)))


# -- the reference's cases ------------------------------------------------------------------------------------------

def test_positive_headroom_least_prefers_the_endpoint_closest_to_its_slo() -> None:
    got = scores(scorer(), cycle_with(a=info(100, 20), b=info(30, 5)), "a", "b")
    assert got == {"a": 0.01, "b": 1.0}  # b: combined 0 -> (100 + 1) / 100, clamped


def test_most_prefers_the_endpoint_with_the_most_headroom() -> None:
    got = scores(scorer(headroomSelectionStrategy="most"), cycle_with(a=info(100, 20), b=info(30, 5)), "a", "b")
    assert got == {"a": 1.0, "b": 0.01}


def test_the_tier_split_case_of_the_reference() -> None:
    got = scores(scorer(), cycle_with(ep1=info(10, 2), ep2=info(50, 10)), "ep1", "ep2")
    assert got["ep1"] > got["ep2"] > 0


@pytest.mark.parametrize("strategy", ["least", "most"])
def test_negative_only_prefers_the_smaller_violation_whatever_the_strategy(strategy: str) -> None:
    cycle = cycle_with(pod1=info(-10, -5, dispatched=2), pod2=info(-100, -30, dispatched=2))
    got = scores(scorer(headroomSelectionStrategy=strategy), cycle, "pod1", "pod2")
    assert got == {"pod1": 1.0, "pod2": 0.01}


def test_idle_endpoints_win_when_every_endpoint_misses_its_slo() -> None:
    cycle = cycle_with(busy=info(-50, -10, dispatched=5), idle=info(-50, -10, dispatched=0))
    got = scores(scorer(), cycle, "busy", "idle")
    assert got["busy"] == 0.0 and got["idle"] > 0


def test_all_idle_negative_endpoints_are_scored_together() -> None:
    cycle = cycle_with(both=info(-50, -10), ttft=info(-30, 5), tpot=info(10, -8))
    assert all(s > 0 for s in scores(scorer(), cycle, "both", "ttft", "tpot").values())


@pytest.mark.parametrize("present, scored", [
    (("both", "ttft", "tpot"), "tpot"),
    (("both", "ttft"), "ttft"),
    (("both",), "both"),
], ids=["tpot-only-first", "then-ttft-only", "then-both"])
def test_busy_negative_endpoints_score_the_least_severe_deficit_bucket(present: tuple[str, ...], scored: str) -> None:
    table = {"both": info(-50, -10, 3), "ttft": info(-30, 5, 3), "tpot": info(10, -8, 3)}
    got = scores(scorer(), cycle_with(**{n: table[n] for n in present}), *present)
    assert {n for n, s in got.items() if s > 0} == {scored}


def test_a_mix_scores_only_the_positive_bucket_and_an_endpoint_without_prediction_joins_it() -> None:
    cycle = cycle_with(pos=info(40, 5), neg=info(-10, 5))
    got = scores(scorer(), cycle, "pos", "neg", "unknown")
    assert got["neg"] == 0.0
    assert got == {"pos": 0.01, "neg": 0.0, "unknown": 1.0}  # unknown: headroom (0, 0), the closest to its SLO


# -- within a bucket ------------------------------------------------------------------------------------------------

def test_a_dimension_without_spread_gives_all_weight_to_the_other() -> None:
    assert bucket_scores([(50, 10), (50, 30)], 0.8, 0.2, most=False) == [1.0, 0.01]  # TPOT alone decides
    assert bucket_scores([(10, 7), (90, 7)], 0.0, 1.0, most=False) == [1.0, 0.01]  # TTFT alone decides


def test_no_spread_at_all_scores_the_middle() -> None:
    assert bucket_scores([(20, 4), (20, 4)], 0.8, 0.2, most=False) == [0.51, 0.51]
    assert bucket_scores([(20, 4)], 0.8, 0.2, most=True) == [0.51]


def test_weights_blend_the_two_dimensions() -> None:
    # a: n_ttft 0, n_tpot 1; b: n_ttft 1, n_tpot 0. least: (int((1 - combined) * 100) + 1) / 100
    assert bucket_scores([(10, 9), (20, 1)], 0.8, 0.2, most=False) == [0.81, 0.2]  # (1 - 0.8) * 100 = 19.99...
    assert bucket_scores([(10, 9), (20, 1)], 0.0, 0.0, most=False) == [1.0, 0.01]  # both 0: TTFT only


def test_absolute_headroom_is_what_is_normalised() -> None:
    assert bucket_scores([(-10, -1), (-90, -1)], 1.0, 0.0, most=False) == [1.0, 0.01]


@pytest.mark.parametrize("infos, expected", [
    ([None, info(-1, 0)], ([0], False)),
    ([info(0, 0), info(-1, 0)], ([0], False)),
    ([info(-1, 0, 1), info(-1, -1, 0)], ([1], True)),
    ([info(-1, -1, 1), info(-1, 2, 1), info(3, -1, 1)], ([2], True)),
], ids=["unknown-is-positive", "zero-is-positive", "idle", "tpot-only"])
def test_select_bucket(infos: list, expected: tuple[list[int], bool]) -> None:
    assert select_bucket(infos) == expected


# -- without predictions: the composite fallback ---------------------------------------------------------------------

def test_composite_fallback_prefers_free_kv_and_short_queues() -> None:
    got = scores(scorer(), CycleState(), "pod1", "pod2", pod1={"kv": 0.2, "running": 3},
                 pod2={"kv": 0.8, "waiting": 5, "running": 10})
    assert got == {"pod1": 0.6, "pod2": 0.07}  # (0.8 + 1 + 0) / 3 and (0.2 + 0 + 0) / 3, in hundredths


def test_composite_fallback_reads_the_prefix_match_and_rounds_halves_up() -> None:
    handle = Handle()
    producer = registry().create(PREFIX_PRODUCER_TYPE, PREFIX_PRODUCER_TYPE, None, handle)
    handle.add(producer)
    plugin = scorer(compositeQueueWeight=0)
    plugin.bind(handle)
    cycle = CycleState({producer.state_key: PrefixMatch([1, 2, 3, 4], {"a": 2}, 64)})
    got = scores(plugin, cycle, "a", "b", a={"kv": 0.875}, b={"kv": 0.875})
    assert got == {"a": 0.31, "b": 0.06}  # (0.125 + 0.5) / 2 = 31.25 -> 31; 0.125 / 2 = 6.25 -> 6


@pytest.mark.parametrize("raw, kv, expected", [
    ({"compositeQueueWeight": 0, "compositePrefixWeight": 0}, 0.875, 0.13),  # 12.5 -> 13, not Python's 12
    ({"compositeKVWeight": 0, "compositeQueueWeight": 0, "compositePrefixWeight": 0}, 0.875, 0.13),  # KV only
    ({"compositeQueueWeight": 0, "compositePrefixWeight": 0}, 1.5, 0.0),  # clamped into [0, 1]
], ids=["go-rounding", "zero-weights", "clamped"])
def test_composite_weights(raw: dict, kv: float, expected: float) -> None:
    assert scores(scorer(**raw), CycleState(), "a", a={"kv": kv}) == {"a": expected}


def test_predictions_for_other_endpoints_only_mean_composite() -> None:
    got = scores(scorer(), cycle_with(elsewhere=info(5, 5)), "a", a={"kv": 0.5})
    assert got == {"a": 0.5}  # (0.5 + 1 + 0) / 3


def test_empty_candidates() -> None:
    assert scorer().score(cycle_with(a=info(1, 1)), req(), []) == []


# -- parameters -----------------------------------------------------------------------------------------------------

def test_defaults_are_the_reference_s() -> None:
    p = scorer().params
    assert (p.ttft_weight, p.tpot_weight, p.headroom_selection_strategy) == (0.8, 0.2, "least")
    assert (p.composite_kv_weight, p.composite_queue_weight, p.composite_prefix_weight) == (1.0, 1.0, 1.0)
    assert LatencyScorer.consumes == (PRODUCER_TYPE, PREFIX_PRODUCER_TYPE)


@pytest.mark.parametrize("strategy", ["middle", "", "LEAST"])
def test_an_unknown_strategy_loads_and_scores_as_least(strategy: str, caplog: pytest.LogCaptureFixture) -> None:
    """The reference's switch sends every strategy but "most" to "least"; its configs load here too."""
    cycle = cycle_with(a=info(100, 20), b=info(30, 5))
    assert scores(scorer(headroomSelectionStrategy=strategy), cycle, "a", "b") == scores(scorer(), cycle, "a", "b")
    assert "headroomSelectionStrategy" in caplog.text


@pytest.mark.parametrize("raw", [{"ttftWeight": -1, "tpotWeight": 2}, {"tpotWeight": -0.9},
                                 {"compositeKVWeight": -1, "compositeQueueWeight": 3}],
                         ids=["negative-ttft", "weights-sum-below-0", "negative-composite"])
def test_negative_weights_load_and_scores_stay_in_range(raw: dict) -> None:
    """The reference does not range-check the weights; whatever they make of a score is clamped to [0, 1]."""
    plugin = scorer(**raw)
    predicted = scores(plugin, cycle_with(a=info(100, 20), b=info(30, 5), c=info(60, 1)), "a", "b", "c")
    fallback = scores(plugin, CycleState(), "a", "b", a={"kv": 0.2, "waiting": 3}, b={"kv": 0.9})
    assert all(0.0 <= s <= 1.0 for s in [*predicted.values(), *fallback.values()])


@pytest.mark.parametrize("raw, field", [
    ({"ttftWeight": "0.8"}, "ttftWeight"),
    ({"epsilonExploreNeg": 0.1}, "epsilonExploreNeg"),
])
def test_bad_parameters_name_the_plugin_and_the_field(raw: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        registry().create("latency-scorer", "lat", raw, Handle())
    assert err.value.field == field and "plugin 'lat' (type: latency-scorer)" in str(err.value)


def bound(raw: dict, *others: object) -> LatencyScorer:
    handle = Handle()
    prefix = registry().create(PREFIX_PRODUCER_TYPE, PREFIX_PRODUCER_TYPE, None, handle)
    for plugin in (prefix, *others):
        handle.add(plugin)  # type: ignore[arg-type]
    plugin = scorer(**raw)
    plugin.bind(handle)
    return plugin


def test_the_named_latency_producer_must_be_configured() -> None:
    bound({"latencyPredictionInfoProducerName": "lp"}, StandInLatencyProducer("lp", None, Handle()))  # type: ignore
    with pytest.raises(ConfigError, match="names plugin 'nowhere', which is not configured") as err:
        bound({"latencyPredictionInfoProducerName": "nowhere"})
    assert err.value.field == "latencyPredictionInfoProducerName"
    with pytest.raises(ConfigError, match=f"is a {PREFIX_PRODUCER_TYPE}, not a {PRODUCER_TYPE}"):
        bound({"latencyPredictionInfoProducerName": PREFIX_PRODUCER_TYPE})


def test_the_named_prefix_producer_must_be_configured() -> None:
    with pytest.raises(ConfigError) as err:
        bound({"prefixMatchInfoProducerName": "nowhere"})
    assert err.value.field == "prefixMatchInfoProducerName"


_check: type[Scorer] = LatencyScorer
