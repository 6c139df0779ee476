"""P/D deciders (prefix-based, always-disagg) and the pd-profile-handler: the reference's rules, v0.3.0 configs."""

from __future__ import annotations

import random
from typing import Any

import pytest

from epp.config.loader import build_pipeline, load_config, load_raw
from epp.errors import ConfigError
from epp.framework.plugins import CycleState, Handle, ProfileRunResult, SchedulingResult
from epp.plugins.filters.decode_filter import DecodeFilter
from epp.plugins.filters.prefill_filter import PrefillFilter
from epp.plugins.pickers.max_score import MaxScorePicker
from epp.plugins.producers.approx_prefix_cache import ApproxPrefixCacheProducer, PrefixMatch
from epp.plugins.profiles.always_disagg_decider import AlwaysDisaggPdDecider
from epp.plugins.profiles.disagg_headers import DisaggHeadersHandler
from epp.plugins.profiles.disagg_profile import DisaggProfileHandler
from epp.plugins.profiles.pd_profile import PdProfileHandler
from epp.plugins.profiles.prefix_based_decider import PrefixBasedPdDecider
from epp.plugins.scorers.prefix_cache import PrefixCacheScorer
from epp.plugins.scorers.queue import QueueScorer
from epp.scheduling.scheduler import Scheduler, SchedulerProfile, WeightedScorer

from .helpers import bind_all, ep, make, registry, req
from .profiles import FIXTURES, POOL, FixedDecider, profile

# --- deciders ------------------------------------------------------------------------------------------


def _decide(raw: dict, prompt_chars: int, match_blocks: int | None, block_chars: int = 64) -> bool:
    producer = make(ApproxPrefixCacheProducer)
    decider = make(PrefixBasedPdDecider, raw)
    bind_all(producer, decider)
    cyc = CycleState()
    if match_blocks is not None:
        cyc[producer.state_key] = PrefixMatch([0] * 10, {"d": match_blocks}, block_chars)
    return decider.disaggregate(cyc, req("x" * prompt_chars), ep("d"))


# prompt 400 characters = 100 tokens; a 64-character block is 16 tokens.
@pytest.mark.parametrize("raw,prompt,blocks,expected", [
    ({}, 4000, 0, False),
    ({"nonCachedTokens": 16}, 60, 0, False),
    ({"nonCachedTokens": 16}, 400, None, False),
    ({"nonCachedTokens": 16}, 400, 0, True),
    ({"nonCachedTokens": 16}, 400, 5, True),
    ({"nonCachedTokens": 16}, 400, 6, False),
    ({"nonCachedTokens": 20}, 400, 5, True),
    ({"nonCachedTokens": 21}, 400, 5, False),
], ids=["zero-disables", "prompt-shorter-than-threshold", "no-match-info", "nothing-cached",
        "20-uncached-over-16", "4-uncached-under-16", "exactly-threshold", "one-under"])
def test_prefix_based_decider(raw: dict, prompt: int, blocks: int | None, expected: bool) -> None:
    assert _decide(raw, prompt, blocks) is expected


# promptTokens (llm-d PR #933): prompts shorter than it stay decode-only whatever the cache holds; 0 is off.
@pytest.mark.parametrize("raw,prompt,blocks,expected", [
    ({"nonCachedTokens": 16, "promptTokens": 0}, 400, 0, True),
    ({"nonCachedTokens": 16, "promptTokens": 100}, 400, 0, True),
    ({"nonCachedTokens": 16, "promptTokens": 101}, 400, 0, False),
    ({"nonCachedTokens": 16, "promptTokens": 101}, 404, 0, True),
    ({"nonCachedTokens": 16, "promptTokens": 50}, 400, 6, False),
    ({"nonCachedTokens": 0, "promptTokens": 10}, 400, 0, False),
], ids=["zero-is-off", "exactly-prompt-tokens", "one-token-short", "long-enough", "gate-passed-but-cached",
        "non-cached-zero-still-disables"])
def test_prefix_based_decider_prompt_tokens(raw: dict, prompt: int, blocks: int, expected: bool) -> None:
    assert _decide(raw, prompt, blocks) is expected


def test_prefix_based_decider_prompt_tokens_rejects_negative() -> None:
    with pytest.raises(ConfigError, match="promptTokens") as info:
        registry().create("prefix-based-pd-decider", "d", {"promptTokens": -1}, Handle())
    assert info.value.field == "promptTokens"


def test_prefix_based_decider_reads_the_named_producer() -> None:
    """prefixMatchInfoProducerName (llm-d PR #2560): the decider reads that producer's match, not the first."""
    first = make(ApproxPrefixCacheProducer, name="first")
    second = make(ApproxPrefixCacheProducer, name="second")
    decider = make(PrefixBasedPdDecider, {"nonCachedTokens": 16, "prefixMatchInfoProducerName": "second"})
    bind_all(first, second, decider)
    cyc = CycleState()
    cyc[first.state_key] = PrefixMatch([0] * 10, {"d": 0}, 64)       # nothing cached: would disaggregate
    cyc[second.state_key] = PrefixMatch([0] * 10, {"d": 6}, 64)      # 96 of 100 tokens cached: decode only
    assert decider.disaggregate(cyc, req("x" * 400), ep("d")) is False


def test_prefix_based_decider_counts_prompt_bytes_as_the_reference() -> None:
    """Thirty CJK characters are 90 UTF-8 bytes = 22 tokens (Go's len), over a threshold of 16: disaggregate.
    Counting characters (7 tokens) would have kept it decode-only."""
    producer = make(ApproxPrefixCacheProducer)
    decider = make(PrefixBasedPdDecider, {"nonCachedTokens": 16})
    bind_all(producer, decider)
    cyc = CycleState()
    cyc[producer.state_key] = PrefixMatch([0] * 2, {"d": 0}, 64)
    assert decider.disaggregate(cyc, req("字" * 30), ep("d")) is True


def test_prefix_based_decider_rejects_negative() -> None:
    with pytest.raises(ConfigError, match="nonCachedTokens"):
        registry().create("prefix-based-pd-decider", "d", {"nonCachedTokens": -1}, Handle())


def test_always_disagg_decider() -> None:
    assert make(AlwaysDisaggPdDecider).disaggregate(CycleState(), req(), ep("d")) is True


def test_prefix_decider_end_to_end_cold_then_warm() -> None:
    producer = make(ApproxPrefixCacheProducer, {"autoTune": False, "blockSizeTokens": 4})
    scorer = make(PrefixCacheScorer)
    decider = make(PrefixBasedPdDecider, {"nonCachedTokens": 16})
    handler = make(DisaggProfileHandler, {"deciders": {"prefill": decider.name}})
    bind_all(producer, scorer, decider, handler)
    scorers = [WeightedScorer(scorer, 2.0), WeightedScorer(make(QueueScorer), 1.0)]
    profiles = {name: SchedulerProfile(name, [flt], scorers, make(MaxScorePicker, rng=random.Random(1)))
                for name, flt in (("prefill", make(PrefillFilter)), ("decode", make(DecodeFilter)))}
    sched = Scheduler(profiles, handler, [producer])
    prompt = "You are a careful assistant. " * 10                      # 290 chars = 72 tokens, 19 blocks
    first = sched.schedule(req(prompt), POOL)
    assert first.prefill is not None                                   # cold: 72 uncached tokens >= 16
    producer.pre_request(req(prompt), first)
    second = sched.schedule(req(prompt), POOL)
    assert second.target is first.target and second.prefill is None    # warm: everything cached on the target
    assert handler.decisions == {"prefill_decode": 1, "decode_only": 1}


# --- pd-profile-handler (v0.3.0) -------------------------------------------------------------------------


def _pd_handler(raw: dict, producer_raw: dict | None = None) -> tuple[PdProfileHandler, ApproxPrefixCacheProducer]:
    producer = make(ApproxPrefixCacheProducer, producer_raw or {"hashBlockSize": 5})
    handler = make(PdProfileHandler, raw)
    bind_all(producer, handler)
    return handler, producer


# prompt 100 characters, 5-character blocks: uncached = 100 - 5 * matched blocks.
@pytest.mark.parametrize("raw,blocks,expected", [
    ({}, 20, True),
    ({"threshold": 10}, 18, True),
    ({"threshold": 11}, 18, False),
    ({"threshold": 10}, None, True),
    ({"threshold": 10, "hashBlockSize": 5}, 19, False),
    ({"threshold": 1000}, 0, False),
], ids=["threshold-zero-always", "exactly-threshold", "under-threshold", "no-match-info-all-uncached",
        "with-hash-block-size", "long-threshold"])
def test_pd_profile_threshold_rule(raw: dict, blocks: int | None, expected: bool) -> None:
    handler, producer = _pd_handler(raw)
    cyc = CycleState()
    if blocks is not None:
        cyc[producer.state_key] = PrefixMatch([0] * 20, {"d": blocks}, 5)
    assert handler.prefill_decider is not None
    assert handler.prefill_decider.disaggregate(cyc, req("y" * 100), ep("d")) is expected


@pytest.mark.parametrize("raw,message,field", [
    ({"primaryPort": 70000}, "primaryPort", "primaryPort"),
    ({"threshold": 5, "deciderPluginName": "x"}, "cannot both be set", None),
    ({"threshold": -1}, "threshold", "threshold"),
], ids=["primary-port-range", "threshold-and-decider", "negative-threshold"])
def test_pd_profile_bad_params(raw: dict, message: str, field: str | None) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        registry().create("pd-profile-handler", "pd", raw, Handle())
    assert info.value.plugin == "pd"
    if field:
        assert info.value.field == field


def test_pd_profile_hash_block_size_must_match_producer() -> None:
    with pytest.raises(ConfigError, match="hashBlockSize 5 differs") as info:
        _pd_handler({"hashBlockSize": 5}, {"blockSizeTokens": 16, "autoTune": False})
    assert info.value.field == "hashBlockSize"
    assert PdProfileHandler.producer_params(make(PdProfileHandler, {"hashBlockSize": 5}).params) == \
        {"hashBlockSize": 5}
    assert PdProfileHandler.producer_params(make(PdProfileHandler).params) == {}


def test_pd_profile_with_named_decider_and_profiles() -> None:
    decider = FixedDecider("my-decider", True)
    handler = make(PdProfileHandler, {"deciderPluginName": "my-decider", "decodeProfile": "dec",
                                      "prefillProfile": "pre"})
    bind_all(decider, handler)
    sched = Scheduler({"pre": profile("pre", make(PrefillFilter)), "dec": profile("dec", make(DecodeFilter))},
                      handler)
    result = sched.schedule(req(), POOL)
    assert result.primary_profile == "dec" and result.prefill_profile == "pre" and decider.asked == ["d2"]
    with pytest.raises(ConfigError, match="'prefill' \\(the prefill profile\\)"):
        make(PdProfileHandler).check_profiles({"decode": object()})


_PD_HEAD = """apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 16}
- type: pd-profile-handler
PD_PARAMS
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: max-score-picker}, {pluginRef: prefix-cache-scorer}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}, {pluginRef: prefix-cache-scorer}]
"""


def _pd_head_pipeline(pd_params: str = "") -> Any:
    return build_pipeline(*load_raw(_PD_HEAD.replace("PD_PARAMS", pd_params), "<pd>"), registry())


def _schedule_twice(pipeline: Any, prompt: str) -> list[SchedulingResult]:
    results = []
    for _ in range(2):
        request = req(prompt)
        result = pipeline.scheduler.schedule(request, POOL)
        for hook in pipeline.pre_request:
            hook.pre_request(request, result)
        results.append(result)
    return results


def test_pd_profile_defaults_to_the_declared_prefix_based_decider() -> None:
    pipeline = _pd_head_pipeline()
    assert isinstance(pipeline.scheduler.handler.prefill_decider, PrefixBasedPdDecider)
    cold, warm = _schedule_twice(pipeline, "a" * 400)                 # 100 tokens, cached after the first
    assert cold.prefill is not None and "x-prefiller-host-port" in cold.headers
    assert warm.prefill is None and "x-prefiller-host-port" not in warm.headers


def test_pd_profile_threshold_keeps_the_v030_rule_beside_a_declared_decider() -> None:
    pipeline = _pd_head_pipeline("  parameters: {threshold: 0}")
    assert not isinstance(pipeline.scheduler.handler.prefill_decider, PrefixBasedPdDecider)
    assert all(r.prefill is not None for r in _schedule_twice(pipeline, "a" * 400))   # threshold 0: always P/D


def test_pd_profile_named_decider_must_exist() -> None:
    with pytest.raises(ConfigError, match="deciderPluginName names plugin 'other', which is not configured") as info:
        _pd_head_pipeline("  name: pd\n  parameters: {deciderPluginName: other}")
    assert info.value.plugin == "pd" and info.value.field == "deciderPluginName"


def test_pd_profile_threshold_rule_reads_the_named_producer() -> None:
    """prefixMatchInfoProducerName picks the producer the v0.3.0 threshold rule reads."""
    other = make(ApproxPrefixCacheProducer, {"hashBlockSize": 5}, name="other")
    named = make(ApproxPrefixCacheProducer, {"hashBlockSize": 5}, name="named")
    handler = make(PdProfileHandler, {"threshold": 10, "prefixMatchInfoProducerName": "named"})
    bind_all(other, named, handler)
    cyc = CycleState()
    cyc[other.state_key] = PrefixMatch([0] * 20, {"d": 0}, 5)        # 100 bytes uncached: would disaggregate
    cyc[named.state_key] = PrefixMatch([0] * 20, {"d": 19}, 5)       # 5 bytes uncached, under 10: decode only
    assert handler.prefill_decider is not None
    assert handler.prefill_decider.disaggregate(cyc, req("y" * 100), ep("d")) is False


@pytest.mark.parametrize("pd_params,message", [
    ("  name: pd\n  parameters: {prefixMatchInfoProducerName: precise}", "'precise', which is not configured"),
    ("  name: pd\n  parameters: {prefixMatchInfoProducerName: decode-filter}",
     "'decode-filter', which is a decode-filter, not a prefix-match producer"),
], ids=["missing", "not-a-producer"])
def test_pd_profile_named_producer_must_exist(pd_params: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        _pd_head_pipeline(pd_params)
    assert info.value.plugin == "pd" and info.value.field == "prefixMatchInfoProducerName"


def test_pd_profile_names_the_auto_created_producer() -> None:
    """The producer EPP creates when none is declared has the reference's default producer name."""
    pipeline = _pd_head_pipeline("  parameters: {prefixMatchInfoProducerName: approx-prefix-cache-producer}")
    cold, warm = _schedule_twice(pipeline, "a" * 400)
    assert cold.prefill is not None and warm.prefill is None


def test_pd_profile_primary_port_routes_decode_through_the_sidecar() -> None:
    pipeline = _pd_head_pipeline("  parameters: {primaryPort: 8000}")
    pool = [ep("p1", role="prefill", address="10.0.1.1", port=8200),
            ep("d1", role="decode", address="10.0.2.1", port=8201)]
    request = req("b" * 400)
    result = pipeline.scheduler.schedule(request, pool)
    for hook in pipeline.pre_request:
        hook.pre_request(request, result)
    assert result.target.hostport == "10.0.2.1:8000" and result.target.name == "d1"
    assert result.headers == {"x-data-parallel-host-port": "10.0.2.1:8201", "x-prefiller-host-port": "10.0.1.1:8200"}


@pytest.mark.parametrize("fixture", ["v0.3.0_pd-epp-config.yaml", "v0.3.0_sim-pd-epp-config.yaml"])
def test_v030_pd_fixtures_keep_the_threshold_rule(fixture: str) -> None:
    pipeline = load_config(FIXTURES / fixture, registry())
    assert not isinstance(pipeline.scheduler.handler.prefill_decider, PrefixBasedPdDecider)


# --- disagg-headers-handler / prefill-header-handler -----------------------------------------------------


@pytest.mark.parametrize("results,expected", [
    ({"decode": [ep("d", address="10.1.1.1")], "prefill": [ep("p", address="10.2.2.2", port=8200)]},
     {"x-prefiller-host-port": "10.2.2.2:8200"}),
    ({"decode": [ep("d")], "prefill": [ep("p", address="fd00::2", port=8000)]},
     {"x-prefiller-host-port": "[fd00::2]:8000"}),
    ({"decode": [ep("d")]}, {}),
    ({"decode": [ep("d")], "encode": [ep("e1", address="10.3.3.3", port=1), ep("e2", address="10.3.3.4", port=2)]},
     {"x-encoder-hosts-ports": "10.3.3.3:1,10.3.3.4:2"}),
], ids=["prefill", "ipv6-bracketed", "decode-only", "encoders-comma-list"])
def test_prefill_header_handler(results: dict, expected: dict) -> None:
    handler = registry().create("prefill-header-handler", "prefill-header-handler", None, Handle())
    assert isinstance(handler, DisaggHeadersHandler)
    result = SchedulingResult({k: ProfileRunResult(v) for k, v in results.items()}, "decode")
    handler.pre_request(req(), result)
    assert result.headers == expected


# --- the v0.3.0 P/D fixture through the real config loader -----------------------------------------------


def test_v030_sim_pd_fixture_schedules_and_sets_header() -> None:
    pipeline = load_config(FIXTURES / "v0.3.0_sim-pd-epp-config.yaml", registry())
    result = pipeline.scheduler.schedule(req("z" * 200), POOL)
    for hook in pipeline.pre_request:
        hook.pre_request(req("z" * 200), result)
    assert result.target.role == "decode" and result.prefill is not None and result.prefill.role == "prefill"
    assert result.headers["x-prefiller-host-port"] == result.prefill.hostport
