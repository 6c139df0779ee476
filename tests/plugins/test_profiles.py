"""Profile handlers and P/D deciders, alone and driving a real :class:`epp.scheduler.Scheduler`."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, ClassVar

import pytest

from epp.config import build_pipeline, load_config, load_raw
from epp.endpoint import Endpoint
from epp.errors import ConfigError, SchedulingFailed
from epp.framework import CycleState, Handle, NoParams, ProfileRunResult, SchedulingResult
from epp.request import InferenceRequest
from epp.scheduler import Scheduler, SchedulerProfile, WeightedScorer
from plugins.filters.decode_filter import DecodeFilter
from plugins.filters.encode_filter import EncodeFilter
from plugins.filters.prefill_filter import PrefillFilter
from plugins.pickers.max_score import MaxScorePicker
from plugins.producers.approx_prefix_cache import ApproxPrefixCacheProducer, PrefixMatch
from plugins.profiles.always_disagg_decider import AlwaysDisaggPdDecider
from plugins.profiles.disagg_headers import DisaggHeadersHandler
from plugins.profiles.disagg_profile import DisaggProfileHandler
from plugins.profiles.pd_profile import PdProfileHandler
from plugins.profiles.prefix_based_decider import PrefixBasedPdDecider
from plugins.profiles.single_profile import SingleProfileHandler
from plugins.scorers.prefix_cache import PrefixCacheScorer
from plugins.scorers.queue import QueueScorer
from plugin_helpers import bind_all, ep, make, names, registry, req

FIXTURES = Path(__file__).parent.parent / "fixtures" / "configs" / "llmd"


class _Answer:
    """A decider with a fixed answer that records the decode endpoints it was asked about."""

    type_name: ClassVar[str] = "fixed-decider"
    Params = NoParams

    def __init__(self, name: str, answer: bool) -> None:
        self.name, self.answer, self.asked = name, answer, []

    def disaggregate(self, cycle: CycleState, request: InferenceRequest, decode_endpoint: Endpoint) -> bool:
        self.asked.append(decode_endpoint.name)
        return self.answer


def _profile(name: str, flt: Any, seed: int = 0) -> SchedulerProfile:
    return SchedulerProfile(name, [flt], [WeightedScorer(make(QueueScorer), 1.0)],
                            make(MaxScorePicker, rng=random.Random(seed)))


def _pd_scheduler(handler: Any, producers: tuple = (), extra: dict | None = None) -> Scheduler:
    profiles = {"prefill": _profile("prefill", make(PrefillFilter)), "decode": _profile("decode", make(DecodeFilter))}
    profiles.update(extra or {})
    return Scheduler(profiles, handler, list(producers))


POOL = [ep("p1", role="prefill", waiting=3), ep("p2", role="prefill", waiting=1),
        ep("d1", role="decode", waiting=2), ep("d2", role="decode", waiting=0),
        ep("e1", role="encode", address="fd00::1", port=9000)]


# --- single-profile-handler -------------------------------------------------------------------------------


def test_single_profile_handler_runs_the_profile_once() -> None:
    h = make(SingleProfileHandler)
    profiles = {"default": object()}
    assert h.pick_profiles(CycleState(), req(), profiles, {}) == ["default"]     # type: ignore[arg-type]
    assert h.pick_profiles(CycleState(), req(), profiles, {"default": None}) == []  # type: ignore[arg-type]


@pytest.mark.parametrize("results,error", [
    ({"default": None}, "failed to run scheduler profile 'default'"),
    ({"default": ProfileRunResult([])}, "failed to run scheduler profile"),
    ({"a": ProfileRunResult([ep("x")]), "b": None}, "single profile"),
], ids=["profile-failed", "profile-empty", "two-profiles"])
def test_single_profile_handler_failures(results: dict, error: str) -> None:
    with pytest.raises(SchedulingFailed, match=error) as info:
        make(SingleProfileHandler).process_results(CycleState(), req(), results)
    assert info.value.status == 429


def test_single_profile_with_real_scheduler() -> None:
    sched = Scheduler({"default": _profile("default", make(DecodeFilter))}, make(SingleProfileHandler))
    result = sched.schedule(req(), POOL)
    assert result.primary_profile == "default" and names(result.endpoints) == ["d2"] and result.prefill is None
    with pytest.raises(SchedulingFailed):
        sched.schedule(req(), [ep("only-prefill", role="prefill")])


# --- disagg-profile-handler: parameters --------------------------------------------------------------------


@pytest.mark.parametrize("raw,expected", [
    ({}, ("decode", "prefill", "encode", None, None)),
    ({"deciders": {"prefill": "dp"}}, ("decode", "prefill", "encode", "dp", None)),
    ({"profiles": {"decode": "D", "prefill": "P"}, "deciders": {"prefill": "dp", "encode": "de"}},
     ("D", "P", "encode", "dp", "de")),
    ({"decodeProfile": "D", "prefillProfile": "P", "deciderPluginName": "dp"}, ("D", "P", "encode", "dp", None)),
    ({"prefillDeciderPluginName": "a", "deciderPluginName": "b", "encodeDeciderPluginName": "c",
      "encodeProfile": "E"}, ("decode", "prefill", "E", "a", "c")),
], ids=["defaults", "nested-decider", "nested-all", "flat", "flat-prefill-name-beats-legacy-alias"])
def test_disagg_parameters(raw: dict, expected: tuple) -> None:
    st = make(DisaggProfileHandler, raw).params.stages()
    assert (st.decode, st.prefill, st.encode, st.prefill_decider, st.encode_decider) == expected


@pytest.mark.parametrize("raw", [
    {"threshold": 10, "hashBlockSize": 5, "prefixPluginType": "prefix-cache-scorer", "prefixPluginName": "p",
     "primaryPort": 8000, "deciderPluginName": "dp"},
    {"primaryPort": 8000, "deciders": {"prefill": "dp"}},
], ids=["flat", "nested"])
def test_disagg_ignores_pd_profile_handler_parameters(raw: dict) -> None:
    st = make(DisaggProfileHandler, raw).params.stages()
    assert (st.decode, st.prefill, st.prefill_decider) == ("decode", "prefill", "dp")


def test_disagg_still_rejects_unknown_parameters() -> None:
    with pytest.raises(ConfigError, match="nonsense"):
        registry().create("disagg-profile-handler", "h", {"nonsense": 1}, Handle())


def test_disagg_mixed_parameter_forms_are_rejected() -> None:
    with pytest.raises(ConfigError, match="cannot mix") as info:
        registry().create("disagg-profile-handler", "h", {"deciders": {"prefill": "x"}, "decodeProfile": "d"},
                          Handle())
    assert info.value.plugin == "h"


@pytest.mark.parametrize("plugins,field,message", [
    ([], "deciders.prefill", "'nope', which is not configured"),
    ([make(QueueScorer, name="nope")], "deciders.prefill", "is not a decider"),
], ids=["dangling", "not-a-decider"])
def test_disagg_bind_errors(plugins: list, field: str, message: str) -> None:
    handler = make(DisaggProfileHandler, {"deciders": {"prefill": "nope"}}, name="h")
    with pytest.raises(ConfigError, match=message) as info:
        bind_all(*plugins, handler)
    assert info.value.plugin == "h" and info.value.field == field


@pytest.mark.parametrize("raw,profiles,field", [
    ({}, ["prefill"], "profiles.decode"),
    ({"deciders": {"prefill": "d"}}, ["decode"], "profiles.prefill"),
    ({"deciders": {"encode": "d"}}, ["decode", "prefill"], "profiles.encode"),
], ids=["no-decode", "decider-without-prefill-profile", "decider-without-encode-profile"])
def test_disagg_check_profiles(raw: dict, profiles: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        make(DisaggProfileHandler, raw).check_profiles({p: object() for p in profiles})
    assert info.value.field == field


def test_disagg_check_profiles_accepts_decode_only_pool() -> None:
    make(DisaggProfileHandler).check_profiles({"decode": object()})


# --- disagg-profile-handler: decisions through the scheduler -----------------------------------------------


def _disagg(answer: bool | None, **raw: Any) -> tuple[DisaggProfileHandler, _Answer | None]:
    decider = _Answer("dec", answer) if answer is not None else None
    handler = make(DisaggProfileHandler, {"deciders": {"prefill": "dec"}} if decider else {}, **raw)
    bind_all(*([decider] if decider else []), handler)
    return handler, decider


def test_disagg_runs_prefill_when_decider_says_yes() -> None:
    handler, decider = _disagg(True)
    result = _pd_scheduler(handler).schedule(req(), POOL)
    assert decider is not None and decider.asked == ["d2"]          # asked about the decode target
    assert result.primary_profile == "decode" and result.target.name == "d2"
    assert result.prefill_profile == "prefill" and result.prefill is not None and result.prefill.name == "p2"
    handler.pre_request(req(), result)
    assert result.headers == {"x-prefiller-host-port": result.prefill.hostport}
    assert handler.decisions == {"prefill_decode": 1}


@pytest.mark.parametrize("answer", [False, None], ids=["decider-says-no", "no-decider"])
def test_disagg_decode_only(answer: bool | None) -> None:
    handler, _ = _disagg(answer)
    result = _pd_scheduler(handler).schedule(req(), POOL)
    assert result.target.name == "d2" and result.prefill is None and result.prefill_profile is None
    assert set(result.profile_results) == {"decode"}
    handler.pre_request(req(), result)
    assert result.headers == {} and handler.decisions == {"decode_only": 1}


def test_disagg_required_prefill_without_endpoint_fails_the_request() -> None:
    """llm-d PR #2521: a prefill the decider asked for that found no endpoint fails the request (429) instead of
    running the prefill work on the decode endpoint."""
    handler, decider = _disagg(True)
    pool = [e for e in POOL if e.role != "prefill"]
    with pytest.raises(SchedulingFailed, match="prefill profile 'prefill' was required but produced no result") \
            as info:
        _pd_scheduler(handler).schedule(req(), pool)
    assert info.value.status == 429 and decider is not None and decider.asked == ["d2"]


def test_disagg_declined_prefill_without_prefill_endpoints_is_decode_only() -> None:
    handler, _ = _disagg(False)
    result = _pd_scheduler(handler).schedule(req(), [e for e in POOL if e.role != "prefill"])
    assert result.target.name == "d2" and result.prefill is None and handler.decisions == {"decode_only": 1}


def test_disagg_encode_without_endpoint_does_not_fail_the_request() -> None:
    enc = _Answer("enc", True)
    handler = make(DisaggProfileHandler, {"deciders": {"encode": "enc"}})
    bind_all(enc, handler)
    sched = _pd_scheduler(handler, extra={"encode": _profile("encode", make(EncodeFilter))})
    result = sched.schedule(req(), [e for e in POOL if e.role != "encode"])
    assert set(result.profile_results) == {"decode"} and enc.asked == ["d2"]


def test_pd_profile_failed_prefill_leaves_request_decode_only() -> None:
    """The deprecated pd-profile-handler keeps llm-d's own ProcessResults: a failed prefill is dropped."""
    decider = _Answer("dec", True)
    handler = make(PdProfileHandler, {"deciderPluginName": "dec"})
    bind_all(decider, handler)
    result = _pd_scheduler(handler).schedule(req(), [e for e in POOL if e.role != "prefill"])
    assert result.target.name == "d2" and result.prefill is None and decider.asked == ["d2"]


def test_disagg_failed_decode_fails_request_without_asking() -> None:
    handler, decider = _disagg(True)
    with pytest.raises(SchedulingFailed, match="decode workers") as info:
        _pd_scheduler(handler).schedule(req(), [e for e in POOL if e.role != "decode"])
    assert info.value.status == 429 and decider is not None and decider.asked == []


def test_disagg_encode_then_prefill() -> None:
    enc, pre = _Answer("enc", True), _Answer("pre", True)
    handler = make(DisaggProfileHandler, {"deciders": {"prefill": "pre", "encode": "enc"}})
    bind_all(enc, pre, handler)
    sched = _pd_scheduler(handler, extra={"encode": _profile("encode", make(EncodeFilter))})
    result = sched.schedule(req(), POOL)
    assert list(result.profile_results) == ["decode", "prefill", "encode"]
    handler.pre_request(req(), result)
    assert result.headers["x-encoder-hosts-ports"] == "[fd00::1]:9000"
    assert result.headers["x-prefiller-host-port"] == result.prefill.hostport  # type: ignore[union-attr]
    assert handler.decisions == {"encode_prefill_decode": 1}
    assert enc.asked == pre.asked == ["d2"]


def test_disagg_each_decider_asked_once_when_it_declines() -> None:
    enc, pre = _Answer("enc", False), _Answer("pre", False)
    handler = make(DisaggProfileHandler, {"deciders": {"prefill": "pre", "encode": "enc"}})
    bind_all(enc, pre, handler)
    sched = _pd_scheduler(handler, extra={"encode": _profile("encode", make(EncodeFilter))})
    result = sched.schedule(req(), POOL)
    assert set(result.profile_results) == {"decode"} and enc.asked == pre.asked == ["d2"]


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
    decider = _Answer("my-decider", True)
    handler = make(PdProfileHandler, {"deciderPluginName": "my-decider", "decodeProfile": "dec",
                                      "prefillProfile": "pre"})
    bind_all(decider, handler)
    sched = Scheduler({"pre": _profile("pre", make(PrefillFilter)), "dec": _profile("dec", make(DecodeFilter))},
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

