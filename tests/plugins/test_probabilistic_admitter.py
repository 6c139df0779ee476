"""probabilistic-admitter: the shedding curve, the saturation it reads, who is never shed, and its parameters
(the reference's plugin_test.go cases and README numbers)."""

from __future__ import annotations

import random

import pytest

from epp.errors import ConfigError
from epp.framework.plugins import Admitter, CycleState, Handle
from epp.framework.request import InferenceRequest
from epp.plugins.requestcontrol.probabilistic_admitter import ProbabilisticAdmitter, shed_probability

from .helpers import ep, make, registry, req


class FixedDraw(random.Random):
    """A ``random.Random`` whose every draw is ``value`` (the reference's ``WithRandFn(func() float64 {...})``)."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def admitter(draw: float | None = None, seed: int = 7, **raw: object) -> ProbabilisticAdmitter:
    rng = FixedDraw(draw) if draw is not None else random.Random(seed)
    return make(ProbabilisticAdmitter, dict(raw), rng=rng)


def prio(priority: int) -> InferenceRequest:
    request = req()
    request.priority = priority
    return request


# -- the curve: min(sat^5 * 300, 1) with the defaults ------------------------------------------------------------

@pytest.mark.parametrize("saturation, expected", [
    (0.0, 0.0),
    (0.08, 0.00098),   # README "dead zone": well under 1 %
    (0.15, 0.0228),    # README: ~2.3 %
    (0.2, 0.096),      # README: ~9.6 %
    (0.3, 0.729),      # README: ~73 %
    (0.34, 1.0),       # README: 100 % at about 0.34
    (20.0, 1.0),
], ids=["idle", "0.08", "0.15", "0.2", "0.3", "0.34", "overloaded"])
def test_default_curve_matches_the_reference_readme(saturation: float, expected: float) -> None:
    assert shed_probability(saturation, 5.0, 300.0) == pytest.approx(expected, abs=5e-5)


def test_full_shedding_starts_at_the_k_power_root() -> None:
    knee = (1 / 300) ** (1 / 5)
    assert shed_probability(knee * 0.99, 5.0, 300.0) < 1.0
    assert shed_probability(knee * 1.0001, 5.0, 300.0) == 1.0
    assert shed_probability((1 / 1000) ** (1 / 5) * 1.0001, 5.0, 1000.0) == 1.0  # README: k=1000 -> ~0.25


# -- the saturation it computes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("endpoints, expected", [
    ([ep("a", kv=0.12)], 0.15),                              # KV 0.12 / 0.8
    ([ep("a", waiting=1)], 0.2),                             # queue 1 / 5
    ([ep("a", waiting=1, kv=0.4)], 0.5),                     # the larger of the two ratios
    ([ep("a", waiting=10), ep("b")], 1.0),                   # averaged: (2.0 + 0.0) / 2
    ([ep("a", update_time=0.0)], 1.0),                       # never scraped: counts as saturated
    ([ep("a", update_time=0.0), ep("b")], 0.5),
    ([ep("a", kv=0.272)], 0.34),                             # the reference's "quintic property" case
], ids=["kv", "queue", "max", "mean", "never-scraped", "never-scraped-mean", "0.34"])
def test_saturation_is_the_mean_roofline(endpoints: list, expected: float) -> None:
    assert admitter().saturation(endpoints) == pytest.approx(expected)


def test_saturation_uses_the_configured_thresholds() -> None:
    adm = admitter(queueDepthThreshold=10, kvCacheUtilThreshold=0.5)
    assert adm.saturation([ep("a", waiting=5, kv=0.1)]) == pytest.approx(0.5)
    assert adm.saturation([ep("a", waiting=1, kv=0.4)]) == pytest.approx(0.8)


# -- who is shed ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("priority", [0, 1, 100], ids=["standard", "critical", "critical-100"])
def test_critical_and_standard_requests_are_always_admitted(priority: int) -> None:
    saturated = [ep("a", waiting=100)]  # saturation 20
    assert admitter(draw=0.0).admit_request(prio(priority), saturated, CycleState()) is None


def test_sheddable_request_is_admitted_when_there_are_no_endpoints() -> None:
    assert admitter(draw=0.0).admit_request(prio(-1), [], CycleState()) is None


@pytest.mark.parametrize("endpoints", [[ep("a", waiting=100)], [ep("a", waiting=5, kv=0.8)],
                                       [ep("a", update_time=0.0)], [ep("a", kv=0.272)]],
                         ids=["overloaded", "saturation-1", "never-scraped", "0.34"])
def test_sheddable_request_is_denied_when_the_probability_is_one(endpoints: list) -> None:
    reason = admitter(draw=0.999).admit_request(prio(-1), endpoints, CycleState())
    assert reason is not None and reason.startswith("probabilistic-admitter: rejected, saturation=")
    assert reason.endswith("prob=1.00")


def test_sheddable_request_is_admitted_at_zero_saturation_whatever_the_draw() -> None:
    assert admitter(draw=0.0).admit_request(prio(-1), [ep("a")], CycleState()) is None


def test_the_draw_decides_below_certainty() -> None:
    endpoints = [ep("a", kv=0.16)]  # saturation 0.2 -> p 0.096
    assert admitter(draw=0.9).admit_request(prio(-1), endpoints, CycleState()) is None
    assert admitter(draw=0.0).admit_request(prio(-1), endpoints, CycleState()) == \
        "probabilistic-admitter: rejected, saturation=0.200 prob=0.10"


@pytest.mark.parametrize("kv, expected", [(0.12, 0.0228), (0.16, 0.096), (0.24, 0.729)],
                         ids=["sat-0.15", "sat-0.2", "sat-0.3"])
def test_seeded_shedding_rate_follows_the_curve(kv: float, expected: float) -> None:
    adm, endpoints, request = admitter(seed=11), [ep("a", kv=kv)], prio(-1)
    n = 20_000
    shed = sum(adm.admit_request(request, endpoints, CycleState()) is not None for _ in range(n))
    assert shed / n == pytest.approx(expected, abs=4 * (expected * (1 - expected) / n) ** 0.5 + 1e-3)


def test_a_seeded_rng_makes_decisions_reproducible() -> None:
    endpoints, request = [ep("a", kv=0.24)], prio(-1)
    runs = []
    for _ in range(2):
        adm = admitter(seed=5)
        runs.append([adm.admit_request(request, endpoints, CycleState()) is None for _ in range(200)])
    assert runs[0] == runs[1] and 0 < sum(runs[0]) < 200


# -- parameters ----------------------------------------------------------------------------------------------------

def test_defaults_and_custom_parameters() -> None:
    default = registry().create("probabilistic-admitter", "shed", None, Handle())
    assert isinstance(default, Admitter) and default.name == "shed"
    p = default.params
    assert (p.queue_depth_threshold, p.kv_cache_util_threshold, p.power, p.k) == (5, 0.8, 5.0, 300.0)
    custom = registry().create("probabilistic-admitter", "shed",
                               {"queueDepthThreshold": 10, "kvCacheUtilThreshold": 0.9, "power": 3, "k": 100}, Handle())
    p = custom.params
    assert (p.queue_depth_threshold, p.kv_cache_util_threshold, p.power, p.k) == (10, 0.9, 3.0, 100.0)


@pytest.mark.parametrize("raw, field", [
    ({"queueDepthThreshold": 0}, "queueDepthThreshold"),
    ({"queueDepthThreshold": -3}, "queueDepthThreshold"),
    ({"kvCacheUtilThreshold": 0}, "kvCacheUtilThreshold"),
    ({"power": 0}, "power"),
    ({"power": -1}, "power"),
    ({"k": 0}, "k"),
    ({"k": -1}, "k"),
    ({"k": "x"}, "k"),
    ({"queueDepthThreshold": 2.5}, "queueDepthThreshold"),
    ({"steepness": 2}, "steepness"),
], ids=["qd-zero", "qd-negative", "kv-zero", "power-zero", "power-negative", "k-zero", "k-negative", "k-text",
        "qd-fraction", "unknown"])
def test_invalid_parameters_name_the_plugin_and_field(raw: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        registry().create("probabilistic-admitter", "shed", raw, Handle())
    assert "'shed'" in str(info.value) and "probabilistic-admitter" in str(info.value)
    assert field in str(info.value)
