"""Profile handlers (single-profile, disagg-profile), alone and driving a real :class:`epp.scheduling.scheduler.Scheduler`."""

from __future__ import annotations

from typing import Any

import pytest

from epp.errors import ConfigError, SchedulingFailed
from epp.framework.plugins import CycleState, Handle, ProfileRunResult
from epp.plugins.filters.decode_filter import DecodeFilter
from epp.plugins.filters.encode_filter import EncodeFilter
from epp.plugins.profiles.disagg_profile import DisaggProfileHandler
from epp.plugins.profiles.pd_profile import PdProfileHandler
from epp.plugins.profiles.single_profile import SingleProfileHandler
from epp.plugins.scorers.queue import QueueScorer
from epp.scheduling.scheduler import Scheduler

from .helpers import bind_all, ep, make, names, registry, req
from .profiles import POOL, FixedDecider, pd_scheduler, profile

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
    sched = Scheduler({"default": profile("default", make(DecodeFilter))}, make(SingleProfileHandler))
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


def _disagg(answer: bool | None, **raw: Any) -> tuple[DisaggProfileHandler, FixedDecider | None]:
    decider = FixedDecider("dec", answer) if answer is not None else None
    handler = make(DisaggProfileHandler, {"deciders": {"prefill": "dec"}} if decider else {}, **raw)
    bind_all(*([decider] if decider else []), handler)
    return handler, decider


def test_disagg_runs_prefill_when_decider_says_yes() -> None:
    handler, decider = _disagg(True)
    result = pd_scheduler(handler).schedule(req(), POOL)
    assert decider is not None and decider.asked == ["d2"]          # asked about the decode target
    assert result.primary_profile == "decode" and result.target.name == "d2"
    assert result.prefill_profile == "prefill" and result.prefill is not None and result.prefill.name == "p2"
    handler.pre_request(req(), result)
    assert result.headers == {"x-prefiller-host-port": result.prefill.hostport}
    assert handler.decisions == {"prefill_decode": 1}


@pytest.mark.parametrize("answer", [False, None], ids=["decider-says-no", "no-decider"])
def test_disagg_decode_only(answer: bool | None) -> None:
    handler, _ = _disagg(answer)
    result = pd_scheduler(handler).schedule(req(), POOL)
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
        pd_scheduler(handler).schedule(req(), pool)
    assert info.value.status == 429 and decider is not None and decider.asked == ["d2"]


def test_disagg_declined_prefill_without_prefill_endpoints_is_decode_only() -> None:
    handler, _ = _disagg(False)
    result = pd_scheduler(handler).schedule(req(), [e for e in POOL if e.role != "prefill"])
    assert result.target.name == "d2" and result.prefill is None and handler.decisions == {"decode_only": 1}


def test_disagg_encode_without_endpoint_does_not_fail_the_request() -> None:
    enc = FixedDecider("enc", True)
    handler = make(DisaggProfileHandler, {"deciders": {"encode": "enc"}})
    bind_all(enc, handler)
    sched = pd_scheduler(handler, extra={"encode": profile("encode", make(EncodeFilter))})
    result = sched.schedule(req(), [e for e in POOL if e.role != "encode"])
    assert set(result.profile_results) == {"decode"} and enc.asked == ["d2"]


def test_pd_profile_failed_prefill_leaves_request_decode_only() -> None:
    """The deprecated pd-profile-handler keeps llm-d's own ProcessResults: a failed prefill is dropped."""
    decider = FixedDecider("dec", True)
    handler = make(PdProfileHandler, {"deciderPluginName": "dec"})
    bind_all(decider, handler)
    result = pd_scheduler(handler).schedule(req(), [e for e in POOL if e.role != "prefill"])
    assert result.target.name == "d2" and result.prefill is None and decider.asked == ["d2"]


def test_disagg_failed_decode_fails_request_without_asking() -> None:
    handler, decider = _disagg(True)
    with pytest.raises(SchedulingFailed, match="decode workers") as info:
        pd_scheduler(handler).schedule(req(), [e for e in POOL if e.role != "decode"])
    assert info.value.status == 429 and decider is not None and decider.asked == []


def test_disagg_encode_then_prefill() -> None:
    enc, pre = FixedDecider("enc", True), FixedDecider("pre", True)
    handler = make(DisaggProfileHandler, {"deciders": {"prefill": "pre", "encode": "enc"}})
    bind_all(enc, pre, handler)
    sched = pd_scheduler(handler, extra={"encode": profile("encode", make(EncodeFilter))})
    result = sched.schedule(req(), POOL)
    assert list(result.profile_results) == ["decode", "prefill", "encode"]
    handler.pre_request(req(), result)
    assert result.headers["x-encoder-hosts-ports"] == "[fd00::1]:9000"
    assert result.headers["x-prefiller-host-port"] == result.prefill.hostport  # type: ignore[union-attr]
    assert handler.decisions == {"encode_prefill_decode": 1}
    assert enc.asked == pre.asked == ["d2"]


def test_disagg_each_decider_asked_once_when_it_declines() -> None:
    enc, pre = FixedDecider("enc", False), FixedDecider("pre", False)
    handler = make(DisaggProfileHandler, {"deciders": {"prefill": "pre", "encode": "enc"}})
    bind_all(enc, pre, handler)
    sched = pd_scheduler(handler, extra={"encode": profile("encode", make(EncodeFilter))})
    result = sched.schedule(req(), POOL)
    assert set(result.profile_results) == {"decode"} and enc.asked == pre.asked == ["d2"]
