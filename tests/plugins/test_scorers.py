"""Scorers: each formula against hand-computed tables (the prefix-cache family is in test_prefix_cache)."""

from __future__ import annotations

import base64
import logging
import random

import pytest

from epp.errors import ConfigError
from epp.framework.plugins import Handle, ProfileRunResult, SchedulingResult
from epp.plugins.pickers.max_score import MaxScorePicker
from epp.plugins.profiles.single_profile import SingleProfileHandler
from epp.plugins.scorers.active_request import ActiveRequestScorer
from epp.plugins.scorers.batch_headroom import BatchHeadroomScorer
from epp.plugins.scorers.kv_cache_utilization import KvCacheUtilizationScorer
from epp.plugins.scorers.load_aware import LoadAwareScorer
from epp.plugins.scorers.lora_affinity import LoraAffinityScorer
from epp.plugins.scorers.queue import QueueScorer
from epp.plugins.scorers.running_requests import RunningRequestsSizeScorer
from epp.plugins.scorers.session_affinity import SessionAffinityScorer, session_token
from epp.plugins.scorers.token_load import TokenLoadScorer
from epp.scheduling.scheduler import Scheduler, SchedulerProfile, WeightedScorer

from .helpers import cycle, ep, make, registry, req


def _scores(scorer, endpoints, request=None):  # type: ignore[no-untyped-def]
    return scorer.score(cycle(), request or req(), endpoints)


@pytest.mark.parametrize("queues,expected", [
    ([0, 5, 10], [1.0, 0.5, 0.0]),
    ([2, 4, 10], [1.0, 0.75, 0.0]),
    ([7, 7, 7], [1.0, 1.0, 1.0]),
    ([3], [1.0]),
    ([], []),
], ids=["spread", "offset-min", "all-equal", "single", "empty"])
def test_queue_scorer_min_max(queues: list[int], expected: list[float]) -> None:
    eps = [ep(f"e{i}", waiting=q) for i, q in enumerate(queues)]
    assert _scores(make(QueueScorer), eps) == pytest.approx(expected)


@pytest.mark.parametrize("running,expected", [
    ([1, 3, 5], [1.0, 0.5, 0.0]),
    ([4, 4], [1.0, 1.0]),
    ([0, 8, 2], [1.0, 0.0, 0.75]),
], ids=["spread", "all-equal", "unordered"])
def test_running_requests_size_scorer(running: list[int], expected: list[float]) -> None:
    eps = [ep(f"e{i}", running=r) for i, r in enumerate(running)]
    assert _scores(make(RunningRequestsSizeScorer), eps) == pytest.approx(expected)


def test_queue_scorer_uses_stale_metrics_as_is() -> None:
    eps = [ep("fresh", waiting=4, update_time=100.0), ep("never-scraped", waiting=0, update_time=0.0)]
    assert _scores(make(QueueScorer), eps) == [0.0, 1.0]


@pytest.mark.parametrize("usage,expected", [
    ([0.0, 0.25, 1.0], [1.0, 0.75, 0.0]),
    ([0.5, 0.5], [0.5, 0.5]),
], ids=["spread", "equal"])
def test_kv_cache_utilization_scorer(usage: list[float], expected: list[float]) -> None:
    eps = [ep(f"e{i}", kv=u) for i, u in enumerate(usage)]
    assert _scores(make(KvCacheUtilizationScorer), eps) == pytest.approx(expected)


def test_kv_cache_scorer_alias_resolves() -> None:
    assert registry().plugin_class("kv-cache-scorer") is KvCacheUtilizationScorer


LORA = "sql-lora"


@pytest.mark.parametrize("running,waiting,max_lora,expected", [
    ({LORA}, set(), 1, 1.0),
    ({LORA, "a", "b"}, {"c"}, 2, 1.0),
    ({"a"}, set(), 2, 0.8),
    (set(), set(), 1, 0.8),
    ({"a"}, {LORA}, 2, 0.6),
    ({"a"}, {LORA}, 3, 0.8),
    ({"a", "b"}, set(), 2, 0.0),
    (set(), set(), 0, 0.0),
], ids=["running", "running-even-when-full", "free-slot", "empty-server", "waiting-no-slot",
        "free-slot-beats-waiting", "full-other-adapters", "no-lora-support"])
def test_lora_affinity_tiers(running: set[str], waiting: set[str], max_lora: int, expected: float) -> None:
    e = ep("e", running_loras=running, waiting_loras=waiting, max_lora=max_lora)
    assert _scores(make(LoraAffinityScorer), [e], req(model=LORA)) == [expected]


@pytest.mark.parametrize("raw,tokens,expected", [
    ({}, [0, 2_097_152, 4_194_304, 9_000_000], [1.0, 0.5, 0.0, 0.0]),
    ({"queueThresholdTokens": 1000}, [0, 250, 1000, 1500], [1.0, 0.75, 0.0, 0.0]),
], ids=["default-threshold", "custom-threshold"])
def test_token_load_scorer(raw: dict, tokens: list[int], expected: list[float]) -> None:
    eps = [ep(f"e{i}", inflight_tokens=t) for i, t in enumerate(tokens)]
    assert _scores(make(TokenLoadScorer, raw), eps) == pytest.approx(expected)


@pytest.mark.parametrize("raw,queues,expected", [
    ({}, [0, 32, 64, 128, 500], [0.5, 0.375, 0.25, 0.0, 0.0]),
    ({"threshold": 10}, [0, 1, 5, 10], [0.5, 0.45, 0.25, 0.0]),
    ({}, [3, 3], [0.48828125, 0.48828125]),
], ids=["default-threshold", "custom-threshold", "all-equal"])
def test_load_aware_scorer(raw: dict, queues: list[int], expected: list[float]) -> None:
    eps = [ep(f"e{i}", waiting=q) for i, q in enumerate(queues)]
    assert _scores(make(LoadAwareScorer, raw), eps) == pytest.approx(expected)


@pytest.mark.parametrize("raw,inflight,expected", [
    ({}, [0, 2, 4], [1.0, 0.5, 0.0]),
    ({}, [0, 0, 0], [1.0, 1.0, 1.0]),
    ({}, [3, 3], [0.0, 0.0]),
    ({"idleThreshold": 2}, [1, 2, 3, 6], [1.0, 1.0, 0.5, 0.0]),
    ({"maxBusyScore": 0.5}, [0, 1, 4], [1.0, 0.375, 0.0]),
    ({"idleThreshold": 1, "maxBusyScore": 0.4, "requestTimeout": "2m"}, [1, 2, 4], [1.0, 0.2, 0.0]),
], ids=["spread", "all-idle", "all-equal-busy", "idle-threshold", "max-busy-score", "both-and-ignored-timeout"])
def test_active_request_scorer(raw: dict, inflight: list[int], expected: list[float]) -> None:
    eps = [ep(f"e{i}", inflight=c) for i, c in enumerate(inflight)]
    assert _scores(make(ActiveRequestScorer, raw), eps) == pytest.approx(expected)


@pytest.mark.parametrize("raw,specs,expected", [
    # scraped cap 8: free = 8 - max(running + waiting, inflight)
    ({}, [dict(running=2, max_num_seqs=8), dict(running=6, max_num_seqs=8), dict(running=8, max_num_seqs=8)],
     [0.75, 0.25, 0.0]),
    # waiting means the batch is full; inflight sees dispatches the scrape has not caught up with
    ({}, [dict(running=3, waiting=2, max_num_seqs=10), dict(running=1, inflight=6, max_num_seqs=10),
          dict(running=4, inflight=2, max_num_seqs=10)], [0.5, 0.4, 0.6]),
    # over capacity never goes negative
    ({}, [dict(running=12, waiting=3, max_num_seqs=8)], [0.0]),
    # the parameter overrides every scraped value
    ({"maxNumSeqs": 4}, [dict(running=1, max_num_seqs=100), dict(running=3)], [0.75, 0.25]),
    # capacity unknown: neutral 0.5
    ({}, [dict(running=0), dict(running=1, max_num_seqs=2)], [0.5, 0.5]),
], ids=["scraped-cap", "waiting-and-inflight", "over-capacity", "param-cap", "unknown-cap"])
def test_batch_headroom_scorer(raw: dict, specs: list[dict], expected: list[float]) -> None:
    eps = [ep(f"e{i}", **s) for i, s in enumerate(specs)]
    assert _scores(make(BatchHeadroomScorer, raw), eps) == pytest.approx(expected)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# Tokens as llm-d's EPP mints them: base64(NamespacedName.String()) = base64("<namespace>/<pod>-rank-<i>").
@pytest.mark.parametrize("header,expected", [
    (_b64("llm-d/pod-b-rank-0"), [0.0, 1.0, 0.0, 0.0]),
    (_b64("llm-d/pod-b-rank-1"), [0.0, 0.0, 1.0, 0.0]),
    (_b64("other/pod-b-rank-0"), [0.0, 0.0, 0.0, 0.0]),
    (_b64("pod-b-rank-0"), [0.0, 0.0, 0.0, 0.0]),
    (_b64("/static-c"), [0.0, 0.0, 0.0, 1.0]),
    (_b64("static-c"), [0.0, 0.0, 0.0, 0.0]),
    ("%%%not-base64", [0.0, 0.0, 0.0, 0.0]),
    (None, [0.0, 0.0, 0.0, 0.0]),
], ids=["reference-token", "second-rank", "other-namespace", "bare-name", "static-endpoint", "static-bare-name",
        "undecodable", "no-token"])
def test_session_affinity_scores(header: str | None, expected: list[float]) -> None:
    eps = [ep("pod-a-rank-0", namespace="llm-d"), ep("pod-b-rank-0", namespace="llm-d"),
           ep("pod-b-rank-1", namespace="llm-d"), ep("static-c")]
    headers = {"x-session-token": header} if header else {}
    assert _scores(make(SessionAffinityScorer), eps, req(headers=headers)) == expected


@pytest.mark.parametrize("namespace,name,expected", [
    ("llm-d", "pod-b-rank-0", "bGxtLWQvcG9kLWItcmFuay0w"),     # base64.StdEncoding of "llm-d/pod-b-rank-0"
    ("", "static-b", "L3N0YXRpYy1i"),                         # "/static-b": Go's String() of an empty namespace
], ids=["pod", "static"])
def test_session_affinity_sets_the_reference_token_for_target(namespace: str, name: str, expected: str) -> None:
    target = ep(name, namespace=namespace)
    result = SchedulingResult({"default": ProfileRunResult([target])}, "default")
    make(SessionAffinityScorer).pre_request(req(), result)
    token = result.response_headers["x-session-token"]
    assert token == session_token(target) == expected
    assert _scores(make(SessionAffinityScorer), [ep("pod-a", namespace=namespace), target],
                   req(headers={"x-session-token": token})) == [0.0, 1.0]


# (type, raw, field, loads, default): the reference replaces the value by its default (llm-d ``NewLoadAware``,
# ``NewActiveRequest``, ``TokenLoadScorerFactory``), so the scores equal those with the default parameters.
@pytest.mark.parametrize("type_name,raw,field", [
    ("token-load-scorer", {"queueThresholdTokens": 0}, "queueThresholdTokens"),
    ("load-aware-scorer", {"threshold": 0}, "threshold"),
    ("load-aware-scorer", {"threshold": -5}, "threshold"),
    ("active-request-scorer", {"maxBusyScore": 2}, "maxBusyScore"),
    ("active-request-scorer", {"maxBusyScore": -0.5}, "maxBusyScore"),
    ("active-request-scorer", {"idleThreshold": -1}, "idleThreshold"),
], ids=["token-threshold-zero", "load-threshold-zero", "load-threshold-negative", "busy-score-two",
        "busy-score-negative", "negative-idle"])
def test_values_the_reference_corrects_fall_back_with_one_warning(type_name: str, raw: dict, field: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    eps = [ep("a", waiting=0), ep("b", waiting=40, inflight=3, inflight_tokens=1000), ep("c", waiting=300, inflight=1)]
    with caplog.at_level(logging.WARNING, logger="epp.plugins"):
        scorer = registry().create(type_name, "s1", raw, Handle())
    default = registry().create(type_name, "s0", None, Handle())
    assert _scores(scorer, eps) == pytest.approx(_scores(default, eps))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "plugin 's1'" in warnings[0] and field in warnings[0]


@pytest.mark.parametrize("type_name,raw", [
    ("load-aware-scorer", {"threshold": "x"}),
    ("active-request-scorer", {"maxBusyScore": "high"}),
    ("batch-headroom-scorer", {"maxNumSeqs": 0}),
    ("queue-scorer", {"threshold": 1}),
], ids=["load-threshold-not-a-number", "busy-score-not-a-number", "zero-seqs", "queue-has-no-params"])
def test_bad_scorer_params_fail_naming_plugin(type_name: str, raw: dict) -> None:
    with pytest.raises(ConfigError) as info:
        registry().create(type_name, "s1", raw, Handle())
    assert info.value.plugin == "s1" and type_name in str(info.value)


def _default_like_scheduler(weights: tuple[float, float], seed: int = 0) -> Scheduler:
    profile = SchedulerProfile("default", [], [WeightedScorer(make(QueueScorer), weights[0]),
                                               WeightedScorer(make(KvCacheUtilizationScorer), weights[1])],
                               make(MaxScorePicker, rng=random.Random(seed)))
    return Scheduler({"default": profile}, make(SingleProfileHandler))


POOL = [ep("short-queue-full-kv", waiting=0, kv=0.9), ep("long-queue-empty-kv", waiting=9, kv=0.1),
        ep("middle", waiting=3, kv=0.5)]


@pytest.mark.parametrize("weights,expected", [
    ((1.0, 1.0), "middle"),                   # queue 1, 0, 2/3 + kv 0.1, 0.9, 0.5 = 1.1, 0.9, 1.1667
    ((2.0, 0.0), "short-queue-full-kv"),
    ((0.0, 1.0), "long-queue-empty-kv"),
], ids=["equal-weights", "kv-weight-zero", "queue-weight-zero"])
def test_weights_in_a_real_scheduler(weights: tuple[float, float], expected: str) -> None:
    result = _default_like_scheduler(weights).schedule(req(), POOL)
    assert result.target.name == expected


def test_all_zero_weights_leave_a_random_tie() -> None:
    picked = {_default_like_scheduler((0.0, 0.0), seed).schedule(req(), POOL).target.name for seed in range(40)}
    assert picked == {e.name for e in POOL}
