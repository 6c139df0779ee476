"""``prefix-cache-affinity-filter``: the sticky/exploration choice, the TTFT load gate and its parameters, and the
prefill-throughput calibration record (split from test_prefix_cache.py, which covers the index and the scorers)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from epp.errors import ConfigError
from epp.framework.plugins import CycleState, Handle
from epp.latency import LATENCY_PREDICTIONS_KEY, LatencyPredictionInfo
from epp.plugins.filters.prefix_cache_affinity import PrefixCacheAffinityFilter
from epp.plugins.producers.approx_prefix_cache import PrefixMatch

from .helpers import approx_producer, bind_all, ep, make, names, registry, req


class _Dice(random.Random):
    """A Random whose random() returns fixed values (exploration draws)."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def _affinity_case(raw: dict, matches: dict[str, int], inflight: dict[str, int], draw: float = 0.5,
                   total: int = 10, n: int = 4, ttft: dict[str, float] | None = None) -> list[str]:
    """The filter's pick among e0..e{n-1}; ``ttft``: predicted TTFT (ms) per endpoint in the cycle state."""
    producer = approx_producer()
    flt = make(PrefixCacheAffinityFilter, raw, rng=_Dice(draw))
    bind_all(producer, flt)
    eps = [ep(f"e{i}", inflight_tokens=inflight.get(f"e{i}", 0)) for i in range(n)]
    cyc = CycleState({producer.state_key: PrefixMatch(list(range(total)), matches, 4)})
    if ttft is not None:
        cyc[LATENCY_PREDICTIONS_KEY] = {name: LatencyPredictionInfo(True, True, 0.0, 0.0, ms, 0.0)
                                        for name, ms in ttft.items()}
    return names(flt.filter(cyc, req(), eps))


ALL4 = ["e0", "e1", "e2", "e3"]


@pytest.mark.parametrize("raw,matches,inflight,draw,expected", [
    ({}, {"e1": 9, "e2": 8, "e3": 7}, {}, 0.5, ["e1", "e2"]),
    ({}, {"e1": 7}, {}, 0.5, ALL4),
    ({"explorationProbability": 0.01}, {"e1": 10}, {}, 0.005, ALL4),
    ({}, {"e1": 10}, {}, 0.0, ["e1"]),
    ({"affinityThreshold": 0.5}, {"e0": 5, "e1": 4}, {}, 0.5, ["e0"]),
    ({"affinityThreshold": 0}, {"e1": 10}, {}, 0.5, ALL4),
    ({"maxTokensInFlightPenalty": 100}, {"e1": 10}, {"e1": 500, "e0": 300, "e2": 450, "e3": 420}, 0.5, ALL4),
    ({"maxTokensInFlightPenalty": 100}, {"e1": 10}, {"e1": 350, "e0": 300, "e2": 260, "e3": 400}, 0.5, ["e1"]),
    ({"maxTTFTPenaltyMs": 1}, {"e1": 10}, {}, 0.5, ["e1"]),
], ids=["keeps-sticky", "none-sticky-keeps-all", "exploration", "no-exploration-by-default", "custom-threshold",
        "threshold-zero-off", "token-gate-breaks", "token-gate-holds", "ttft-gate-inert-without-predictions"])
def test_prefix_cache_affinity_filter(raw: dict, matches: dict[str, int], inflight: dict[str, int], draw: float,
                                      expected: list[str]) -> None:
    assert _affinity_case(raw, matches, inflight, draw) == expected


PREDICTED = {"ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 5000}


@pytest.mark.parametrize("raw,inflight,ttft,expected", [
    (PREDICTED, {}, {"e1": 6000, "e0": 900, "e2": 500, "e3": 700}, ALL4),
    (PREDICTED, {}, {"e1": 5400, "e0": 900, "e2": 500}, ["e1"]),
    (PREDICTED, {}, {"e0": 900}, ALL4),
    (PREDICTED, {}, {"e1": 90000}, ALL4),
    (PREDICTED, {}, {}, ALL4),
    ({"ttftSource": "latencyPredictor"}, {}, {"e1": 18500, "e0": 400}, ALL4),
    ({"ttftSource": "latencyPredictor"}, {}, {"e1": 18000, "e0": 10}, ["e1"]),
    ({**PREDICTED, "maxTTFTPenaltyMs": 0}, {}, {"e1": 60000, "e0": 10}, ["e1"]),
    ({"ttftSource": "prefillThroughput", "peakPrefillThroughput": 1000, "maxTTFTPenaltyMs": 100},
     {"e1": 500, "e0": 50, "e2": 600, "e3": 700}, None, ALL4),
    ({"ttftSource": "prefillThroughput", "peakPrefillThroughput": 1000, "maxTTFTPenaltyMs": 100},
     {"e1": 140, "e0": 50, "e2": 600, "e3": 700}, None, ["e1"]),
    ({"ttftSource": "prefillThroughput", "maxTTFTPenaltyMs": 5000}, {"e1": 100_000, "e0": 0}, {"e1": 0.0}, ALL4),
    ({}, {"e1": 300_000, "e0": 0}, None, ALL4),
    ({}, {"e1": 280_000, "e0": 0}, None, ["e1"]),
], ids=["predicted-gate-breaks", "predicted-gate-holds", "sticky-unpredicted-missing-signal",
        "others-unpredicted-missing-signal", "nothing-predicted-missing-signal", "default-penalty-18s-breaks",
        "default-penalty-18s-holds", "gate-off", "throughput-gate-breaks", "throughput-gate-holds",
        "throughput-default-peak-ignores-predictions", "default-source-throughput-breaks",
        "default-source-throughput-holds"])
def test_prefix_cache_affinity_ttft_load_gate(raw: dict, inflight: dict[str, int], ttft: dict[str, float] | None,
                                              expected: list[str]) -> None:
    """llm-d-router's TTFT load gate: stickiness breaks when the best sticky endpoint's TTFT (in-flight tokens over
    peakPrefillThroughput by default, or predicted) exceeds the best other's by more than maxTTFTPenaltyMs (18000 by
    default; 300000 tokens at 15928 tokens/s is 18.8 s); a side with no prediction keeps all (missing signal)."""
    raw = {"explorationProbability": 0, **raw}
    assert _affinity_case(raw, {"e1": 10}, inflight, ttft=ttft) == expected


@pytest.mark.parametrize("raw,field,message", [
    ({"penaltySource": "sessionCost"}, "penaltySource", "session-state producer"),
    ({"ttftSource": "prefillThroughput", "peakPrefillThroughput": 0}, "peakPrefillThroughput",
     "peakPrefillThroughput must be > 0"),
    ({"ttftSource": "fastest"}, "ttftSource", "latencyPredictor"),
    ({"peakPrefillThroughput": -1}, "peakPrefillThroughput", "greater than or equal to 0"),
    ({"affinityThreshold": -0.1}, "affinityThreshold", "greater than or equal to 0"),
    ({"prefillCalibrationRequired": True}, "prefillCalibrationFile", "prefillCalibrationFile is empty"),
])
def test_prefix_cache_affinity_gate_parameters_are_checked(raw: dict, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        registry().create("prefix-cache-affinity-filter", "pcaf", raw, Handle())
    assert message in str(info.value) and info.value.plugin == "pcaf" and info.value.field == field


def test_prefix_cache_affinity_throughput_gate_off_needs_no_peak() -> None:
    flt = make(PrefixCacheAffinityFilter, {"ttftSource": "prefillThroughput", "peakPrefillThroughput": 0,
                                           "maxTTFTPenaltyMs": 0})
    assert flt.params.peak_prefill_throughput == 0


GOOD_RECORD = {"schema_version": 1, "status": "OK", "fingerprint": "sha256:pool-a", "chunk_tokens": 8192,
               "valid_samples": 12, "median_ttft_seconds": 0.5, "peak_prefill_tokens_per_second": 20000.0}


def _calibrated(tmp_path: Path, record: object, **raw: object) -> PrefixCacheAffinityFilter:
    path = tmp_path / "prefix-calibration.json"
    path.write_text(json.dumps(record))
    params = {"prefillCalibrationFile": str(path), "prefillCalibrationFingerprint": "sha256:pool-a", **raw}
    return registry().create("prefix-cache-affinity-filter", "pcaf", params, Handle())  # type: ignore[return-value]


@pytest.mark.parametrize("record,raw,peak,source", [
    (GOOD_RECORD, {}, 20000.0, "calibrated"),
    (GOOD_RECORD, {"peakPrefillThroughput": 15928}, 15928, "userConfigured"),
    (GOOD_RECORD, {"ttftSource": "latencyPredictor"}, 15928, "notUsed"),
    (GOOD_RECORD, {"prefillCalibrationFingerprint": "sha256:pool-b"}, 15928, "default"),
    ({**GOOD_RECORD, "status": "FAILED"}, {}, 15928, "default"),
    ({**GOOD_RECORD, "valid_samples": 9}, {}, 15928, "default"),
    ({**GOOD_RECORD, "schema_version": 2}, {}, 15928, "default"),
    ({**GOOD_RECORD, "chunk_tokens": None}, {}, 15928, "default"),
    ({**GOOD_RECORD, "median_ttft_seconds": 0}, {}, 15928, "default"),
    ({**GOOD_RECORD, "fingerprint": ""}, {}, 15928, "default"),
    ([1, 2], {}, 15928, "default"),
], ids=["applied", "explicit-value-wins-even-at-default", "predictor-needs-none", "other-deployment", "not-ok",
        "too-few-samples", "other-schema", "no-chunk", "bad-median", "no-fingerprint", "not-an-object"])
def test_prefix_cache_affinity_calibration_record(tmp_path: Path, record: object, raw: dict, peak: float,
                                                  source: str) -> None:
    """llm-d-router's prefillCalibrationFile: explicit peakPrefillThroughput > fingerprint-matched complete record
    > the default; a record that cannot be applied leaves the default."""
    flt = _calibrated(tmp_path, record, **raw)
    assert (flt.params.peak_prefill_throughput, flt.peak_prefill_source) == (peak, source)


def test_prefix_cache_affinity_calibrated_peak_drives_the_gate(tmp_path: Path) -> None:
    """At the calibrated 1000 tokens/s, 600 tokens more in flight on the sticky endpoint is 600 ms over a 500 ms
    penalty: the gate breaks (at the default 15928 tokens/s it would hold)."""
    flt = _calibrated(tmp_path, {**GOOD_RECORD, "peak_prefill_tokens_per_second": 1000}, maxTTFTPenaltyMs=500)
    producer = approx_producer()
    bind_all(producer, flt)
    eps = [ep("e0"), ep("e1", inflight_tokens=600)]
    cyc = CycleState({producer.state_key: PrefixMatch(list(range(10)), {"e1": 10}, 4)})
    assert names(flt.filter(cyc, req(), eps)) == ["e0", "e1"]


@pytest.mark.parametrize("record", [{**GOOD_RECORD, "status": "NOT_RUN"}, GOOD_RECORD])
def test_prefix_cache_affinity_required_calibration_fails_start_up(tmp_path: Path, record: dict) -> None:
    with pytest.raises(ConfigError) as info:
        _calibrated(tmp_path, record, prefillCalibrationRequired=True, prefillCalibrationFingerprint="sha256:other")
    assert info.value.plugin == "pcaf" and "calibration not applied" in str(info.value)


def test_prefix_cache_affinity_missing_calibration_file_is_skipped(tmp_path: Path) -> None:
    raw = {"prefillCalibrationFile": str(tmp_path / "absent.json"), "prefillCalibrationFingerprint": "x"}
    flt = registry().create("prefix-cache-affinity-filter", "pcaf", raw, Handle())
    assert (flt.params.peak_prefill_throughput, flt.peak_prefill_source) == (15928, "default")


def test_prefix_cache_affinity_single_endpoint_and_no_info() -> None:
    assert _affinity_case({}, {}, {}, n=1) == ["e0"]
    producer = approx_producer()
    flt = make(PrefixCacheAffinityFilter, rng=_Dice(0.5))
    bind_all(producer, flt)
    eps = [ep("a"), ep("b")]
    assert flt.filter(CycleState(), req(), eps) == eps

