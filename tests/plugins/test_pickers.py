"""Pickers: max-score (random tie-break), random, weighted-random (A-Res); all take an injectable rng."""

from __future__ import annotations

import logging
import random
from collections import Counter

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.framework.plugins import Handle
from epp.plugins.pickers.max_score import MaxScorePicker
from epp.plugins.pickers.random_picker import RandomPicker
from epp.plugins.pickers.weighted_random import WeightedRandomPicker

from .helpers import cycle, ep, make, names, registry, req, scored

A, B, C, D = ep("a"), ep("b"), ep("c"), ep("d")


def _pick(cls: type, raw: dict, candidates, seed: int = 0) -> list[str]:  # type: ignore[no-untyped-def]
    picker = make(cls, raw, rng=random.Random(seed))
    return names(picker.pick(cycle(), req(), candidates).endpoints)


def _tally(cls: type, raw: dict, candidates, seeds: int = 200) -> Counter:  # type: ignore[no-untyped-def]
    return Counter(_pick(cls, raw, candidates, s)[0] for s in range(seeds))


@pytest.mark.parametrize("raw,pairs,expected", [
    ({}, [(A, 0.2), (B, 0.9), (C, 0.5)], ["b"]),
    ({"maxNumOfEndpoints": 2}, [(A, 0.2), (B, 0.9), (C, 0.5)], ["b", "c"]),
    ({"maxNumOfEndpoints": 3}, [(A, 3.0), (B, 1.0), (C, 2.0)], ["a", "c", "b"]),
    ({"maxNumOfEndpoints": 10}, [(A, 0.1), (B, 0.3)], ["b", "a"]),
    ({}, [(A, 0.4)], ["a"]),
    ({}, [], []),
], ids=["best", "top-two", "full-order", "more-than-candidates", "single", "empty"])
def test_max_score_picker_order(raw: dict, pairs: list, expected: list[str]) -> None:
    assert _pick(MaxScorePicker, raw, scored(*pairs)) == expected


def test_max_score_ties_are_broken_at_random() -> None:
    counts = _tally(MaxScorePicker, {}, scored((A, 0.7), (B, 0.7), (C, 0.2), (D, 0.7)))
    assert set(counts) == {"a", "b", "d"}          # every tied endpoint wins sometimes, the loser never
    assert min(counts.values()) > 40                 # roughly uniform: ~67 each of 200


def test_max_score_ties_within_fallback_list_vary() -> None:
    orders = {tuple(_pick(MaxScorePicker, {"maxNumOfEndpoints": 3}, scored((A, 0.5), (B, 0.5), (C, 0.9)), s))
              for s in range(50)}
    assert orders == {("c", "a", "b"), ("c", "b", "a")}


def test_max_score_all_zero_scores_is_uniform() -> None:
    counts = _tally(MaxScorePicker, {}, scored((A, 0.0), (B, 0.0), (C, 0.0)), seeds=300)
    assert set(counts) == {"a", "b", "c"} and min(counts.values()) > 60


def test_same_seed_same_pick() -> None:
    cands = scored((A, 1.0), (B, 1.0), (C, 1.0), (D, 1.0))
    assert [_pick(MaxScorePicker, {}, cands, 7) for _ in range(3)] == [_pick(MaxScorePicker, {}, cands, 7)] * 3


@pytest.mark.parametrize("raw,n", [({}, 1), ({"maxNumOfEndpoints": 3}, 3), ({"maxNumOfEndpoints": 9}, 4)],
                         ids=["one", "three", "more-than-candidates"])
def test_random_picker_returns_distinct_endpoints(raw: dict, n: int) -> None:
    got = _pick(RandomPicker, raw, scored((A, 0.9), (B, 0.1), (C, 0.0), (D, 0.5)), seed=3)
    assert len(got) == n and len(set(got)) == n


def test_random_picker_ignores_scores() -> None:
    counts = _tally(RandomPicker, {}, scored((A, 1.0), (B, 0.0), (C, 0.0), (D, 0.0)), seeds=400)
    assert set(counts) == {"a", "b", "c", "d"} and min(counts.values()) > 60


def test_random_picker_empty() -> None:
    assert _pick(RandomPicker, {}, []) == []


def test_weighted_random_is_proportional_to_score() -> None:
    picker = make(WeightedRandomPicker, rng=random.Random(42))
    cands = scored((A, 1.0), (B, 3.0), (C, 0.0))
    counts = Counter(picker.pick(cycle(), req(), cands).endpoints[0].name for _ in range(4000))
    assert "c" not in counts                         # score 0 gets key 0: never chosen while others are positive
    assert counts["b"] / 4000 == pytest.approx(0.75, abs=0.03)


def test_weighted_random_all_zero_falls_back_to_uniform() -> None:
    counts = _tally(WeightedRandomPicker, {}, scored((A, 0.0), (B, 0.0), (C, -1.0)), seeds=300)
    assert set(counts) == {"a", "b", "c"} and min(counts.values()) > 60


@pytest.mark.parametrize("raw,pairs,expected_len", [
    ({"maxNumOfEndpoints": 2}, [(A, 0.5), (B, 0.5), (C, 0.5)], 2),
    ({"maxNumOfEndpoints": 3}, [(A, 0.5), (B, 0.0), (C, 0.5)], 3),
    ({"maxNumOfEndpoints": 2}, [], 0),
], ids=["two-of-three", "zero-score-fills-last", "empty"])
def test_weighted_random_fallback_list(raw: dict, pairs: list, expected_len: int) -> None:
    got = _pick(WeightedRandomPicker, raw, scored(*pairs), seed=5)
    assert len(got) == expected_len and len(set(got)) == expected_len
    if expected_len == 3:
        assert got[-1] == "b"                        # the zero-score endpoint can only come after positive ones


@pytest.mark.parametrize("type_name", ["max-score-picker", "random-picker", "weighted-random-picker"])
@pytest.mark.parametrize("n", [0, -2])
def test_max_num_of_endpoints_below_one_means_one_with_a_warning(type_name: str, n: int,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """llm-d's picker constructors replace ``maxNumOfEndpoints <= 0`` by 1; a config that loads there loads here."""
    text = f"""apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: {type_name}
  name: p
  parameters: {{maxNumOfEndpoints: {n}}}
- type: queue-scorer
"""
    with caplog.at_level(logging.WARNING, logger="epp.plugins"):
        pipeline = build_pipeline(*load_raw(text, "<t>"), registry())
    picker = pipeline.scheduler.profiles["default"].picker
    assert picker is not None and picker.name == "p"
    assert len(picker.pick(cycle(), req(), scored((A, 0.5), (B, 0.7), (C, 0.1))).endpoints) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "plugin 'p'" in warnings[0] and "maxNumOfEndpoints" in warnings[0]


def test_max_num_of_endpoints_of_the_wrong_type_is_still_an_error() -> None:
    with pytest.raises(ConfigError, match="maxNumOfEndpoints"):
        registry().create("max-score-picker", "p", {"maxNumOfEndpoints": "two"}, Handle())
