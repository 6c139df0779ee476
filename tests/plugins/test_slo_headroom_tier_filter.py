"""slo-headroom-tier-filter: the positive tier most of the time, the negative tier with probability
epsilonExploreNeg, everything without predictions, and its parameters (the reference's plugin_test.go cases)."""

from __future__ import annotations

import random

import pytest

from epp.errors import ConfigError
from epp.framework.plugins import CycleState, Filter, Handle
from epp.latency import PRODUCER_TYPE
from epp.plugins.filters.slo_headroom_tier import SloHeadroomTierFilter

from .helpers import ep, make, registry, req
from .latency import StandInLatencyProducer, cycle_with, info


class FixedDraw(random.Random):
    """A ``random.Random`` whose every draw is ``value``; counts its draws."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value, self.draws = value, 0

    def random(self) -> float:
        self.draws += 1
        return self.value


def tier(eps: float | None = None, rng: random.Random | None = None) -> SloHeadroomTierFilter:
    raw = {} if eps is None else {"epsilonExploreNeg": eps}
    return make(SloHeadroomTierFilter, raw, rng=rng or random.Random(1))


def kept(plugin: SloHeadroomTierFilter, cycle: CycleState, *names: str) -> list[str]:
    return [e.name for e in plugin.filter(cycle, req(), [ep(n) for n in names])]


@pytest.mark.parametrize("names, cycle, expected", [
    (("a",), cycle_with(a=info(-10, -5)), ["a"]),
    ((), cycle_with(), []),
    (("a", "b"), CycleState(), ["a", "b"]),
    (("a", "b"), cycle_with(other=info(10, 5)), ["a", "b"]),
    (("a", "b"), cycle_with(a=info(100, 50), b=info(200, 80)), ["a", "b"]),
    (("a", "b"), cycle_with(a=info(-100, -50), b=info(-200, -80)), ["a", "b"]),
    (("pos1", "neg1", "pos2"), cycle_with(pos1=info(100, 50), neg1=info(-100, -50), pos2=info(200, 80)),
     ["pos1", "pos2"]),
    (("a", "b"), cycle_with(a=info(0, 0), b=info(0, -1)), ["a"]),
    (("a", "b"), cycle_with(a=info(-1, 5)), ["a", "b"]),
], ids=["single", "empty", "no-predictions", "only-others-predicted", "all-positive", "all-negative",
        "both-tiers-positive-kept-in-order", "zero-is-positive", "negative-and-unknown"])
def test_tiers_without_exploring(names: tuple[str, ...], cycle: CycleState, expected: list[str]) -> None:
    assert kept(tier(0.0), cycle, *names) == expected


def test_always_exploring_keeps_the_negative_tier() -> None:
    assert kept(tier(1.0), cycle_with(pos1=info(100, 50), neg1=info(-100, -50)), "pos1", "neg1") == ["neg1"]


@pytest.mark.parametrize("eps, expected", [(0.0, ["pos1"]), (1.0, ["nopred"])])
def test_an_endpoint_without_prediction_is_in_the_negative_tier(eps: float, expected: list[str]) -> None:
    assert kept(tier(eps), cycle_with(pos1=info(100, 50)), "pos1", "nopred") == expected


def test_validity_flags_are_not_read_only_the_headroom() -> None:
    cycle = cycle_with(a=info(5, 5, valid=False), b=info(-5, 5, valid=True))
    assert kept(tier(0.0), cycle, "a", "b") == ["a"]


@pytest.mark.parametrize("draw, expected", [(0.009, ["neg"]), (0.01, ["pos"]), (0.5, ["pos"])])
def test_the_draw_explores_below_epsilon(draw: float, expected: list[str]) -> None:
    rng = FixedDraw(draw)
    assert kept(tier(rng=rng), cycle_with(pos=info(1, 1), neg=info(-1, 1)), "pos", "neg") == expected
    assert rng.draws == 1


def test_there_is_no_draw_with_a_single_tier() -> None:
    rng = FixedDraw(0.0)
    assert kept(tier(rng=rng), cycle_with(a=info(1, 1), b=info(2, 2)), "a", "b") == ["a", "b"]
    assert kept(tier(rng=rng), cycle_with(a=info(-1, 1), b=info(-2, 2)), "a", "b") == ["a", "b"]
    assert rng.draws == 0


def test_the_default_explores_about_one_percent() -> None:
    plugin = tier(rng=random.Random(42))
    cycle = cycle_with(pos=info(1, 1), neg=info(-1, 1))
    endpoints = [ep("pos"), ep("neg")]
    explored = sum(plugin.filter(cycle, req(), endpoints)[0].name == "neg" for _ in range(20_000))
    assert 140 <= explored <= 260  # 200 expected; a binomial sd of 14


# -- parameters -----------------------------------------------------------------------------------------------------

def test_defaults() -> None:
    assert tier().params.epsilon_explore_neg == 0.01
    assert SloHeadroomTierFilter.consumes == (PRODUCER_TYPE,)


@pytest.mark.parametrize("raw, field", [
    ({"epsilonExploreNeg": 1.5}, "epsilonExploreNeg"),
    ({"epsilonExploreNeg": -0.01}, "epsilonExploreNeg"),
    ({"epsilonExploreNeg": "0.1"}, "epsilonExploreNeg"),
    ({"ttftWeight": 0.8}, "ttftWeight"),
])
def test_bad_parameters_name_the_plugin_and_the_field(raw: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        registry().create("slo-headroom-tier-filter", "tier", raw, Handle())
    assert err.value.field == field and "plugin 'tier' (type: slo-headroom-tier-filter)" in str(err.value)


def test_the_named_producer_must_be_configured() -> None:
    handle = Handle()
    handle.add(StandInLatencyProducer("lp", None, handle))  # type: ignore[arg-type]
    make(SloHeadroomTierFilter, {"latencyPredictionInfoProducerName": "lp"}).bind(handle)
    make(SloHeadroomTierFilter).bind(Handle())  # unset: nothing to check
    with pytest.raises(ConfigError, match="latencyPredictionInfoProducerName names plugin 'x', which is not") as err:
        make(SloHeadroomTierFilter, {"latencyPredictionInfoProducerName": "x"}).bind(handle)
    assert err.value.field == "latencyPredictionInfoProducerName" and err.value.plugin == "slo-headroom-tier-filter"


_check: type[Filter] = SloHeadroomTierFilter
