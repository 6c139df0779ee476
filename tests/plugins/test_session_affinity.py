"""session-affinity-scorer (both algorithms), session-affinity-filter (both strategies) and session-id-producer,
against the reference's documented behaviour (llm-d-router ``sessionaffinity`` scorer/filter, ``sessionid``)."""

from __future__ import annotations

from typing import Any

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.framework.plugins import CycleState, Handle, ProfileRunResult, SchedulingResult
from epp.plugins.filters.session_affinity import SessionAffinityFilter
from epp.plugins.producers.session_id import SessionIdProducer, cookie_value
from epp.plugins.scorers.session_affinity import SessionAffinityScorer
from epp.plugins.session_binding import session_token

from .helpers import bind_all, ep, make, names, registry, req


class Clock:
    """A settable monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def result(primary: list[Any], prefill: list[Any] | None = None, cyc: CycleState | None = None) -> SchedulingResult:
    profiles: dict[str, ProfileRunResult | None] = {"decode": ProfileRunResult(primary)}
    if prefill is not None:
        profiles["prefill"] = ProfileRunResult(prefill)
    return SchedulingResult(profiles, "decode", "prefill" if prefill is not None else None,
                            cycle=cyc if cyc is not None else CycleState())


def run(plugin: Any, headers: dict[str, str], endpoints: list[Any], picked: Any | None = None) -> list[float]:
    """Score a request, then commit ``picked`` (default: the best-scored endpoint) as the scheduler would."""
    cyc, request = CycleState(), req(headers=headers)
    scores = plugin.score(cyc, request, endpoints)
    chosen = picked or endpoints[max(range(len(scores)), key=scores.__getitem__)]
    plugin.pre_request(request, result([chosen], cyc=cyc))
    return scores


A, B, C = ep("pod-a", namespace="ns"), ep("pod-b", namespace="ns"), ep("pod-c", namespace="ns")


# -- parameters ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("type_name,raw,field", [
    ("session-affinity-scorer", {"algorithm": "cookie"}, "algorithm"),
    ("session-affinity-scorer", {"evictionTtlSeconds": 0}, "evictionTtlSeconds"),
    ("session-affinity-scorer", {"evictionSweepSeconds": -1}, "evictionSweepSeconds"),
    ("session-affinity-scorer", {"missThreshold": -1}, "missThreshold"),
    ("session-affinity-scorer", {"sessionIDProducerName": "x"}, "sessionIDProducerName"),
    ("session-affinity-filter", {"strategy": "session_id_header"}, "strategy"),
    ("session-affinity-filter", {"sessionIdConfig": {"sources": [{}]}}, "sessionIdConfig"),
    ("session-affinity-filter", {"sessionIdConfig": {"sources": [{"header": "a", "attribute": "b"}]}},
     "sessionIdConfig"),
    ("session-affinity-filter", {"sessionIdConfig": {"evictionTtlSeconds": -5}}, "sessionIdConfig"),
    ("session-id-producer", None, None),
    ("session-id-producer", {"headerName": "a", "cookieName": "b"}, None),
    ("session-id-producer", {"headerName": "  "}, None),
    ("session-id-producer", {"headerName": "a", "lruSize": -1}, "lruSize"),
    ("session-id-producer", {"headerName": "a", "ttl": "0s"}, "ttl"),
    ("session-id-producer", {"headerName": "a", "ttl": "soon"}, "ttl"),
    ("session-id-producer", {"headerName": "a", "ttl": 60}, "ttl"),
], ids=["algorithm", "ttl-zero", "sweep-negative", "misses-negative", "unknown-key", "strategy", "source-empty",
        "source-both", "filter-ttl-negative", "producer-no-source", "producer-both", "producer-blank",
        "lru-negative", "ttl-zero-duration", "ttl-not-duration", "ttl-number"])
def test_invalid_parameters_are_config_errors_naming_the_field(type_name: str, raw: dict[str, Any] | None,
                                                                field: str | None) -> None:
    with pytest.raises(ConfigError) as err:
        registry().create(type_name, "p", raw, Handle())
    assert "plugin 'p'" in str(err.value)
    if field is not None:
        assert field in str(err.value)


def test_reference_readme_examples_load() -> None:
    """The scorer's and filter's README configurations (which EPP used to reject) build a pipeline."""
    text = """
plugins:
- type: session-affinity-scorer
  parameters: {headerName: x-session-token}
- name: sid-scorer
  type: session-affinity-scorer
  parameters: {algorithm: session_id_header, headerName: x-session-token, evictionTtlSeconds: 600,
               evictionSweepSeconds: 30}
- name: prefill-pin
  type: session-affinity-scorer
  parameters: {headerName: x-session-token-prefill, profileName: prefill}
- type: session-affinity-filter
  parameters:
    strategy: session_id
    sessionIdConfig: {sources: [{header: x-session-id}], evictionTtlSeconds: 300, evictionSweepSeconds: 10}
- name: decode-pin
  type: session-affinity-filter
  parameters: {encodedEndpointHeaderConfig: {header: x-session-token}}
- type: session-id-producer
  parameters: {cookieName: llm-d-session, ttl: 1h, lruSize: 4096}
"""
    pipeline = build_pipeline(*load_raw(text), registry())
    assert {p.type_name for p in pipeline.handle.plugins()} >= {"session-affinity-scorer", "session-affinity-filter",
                                                                "session-id-producer"}


# -- scorer: encoded_endpoint_header ----------------------------------------------------------------------------

def test_encoded_scorer_reads_and_writes_its_configured_header() -> None:
    scorer = make(SessionAffinityScorer, {"headerName": "X-Pin"})
    assert scorer.score(CycleState(), req(headers={"x-pin": session_token(B)}), [A, B]) == [0.0, 1.0]
    assert scorer.score(CycleState(), req(headers={"x-session-token": session_token(B)}), [A, B]) == [0.0, 0.0]
    res = result([A])
    scorer.pre_request(req(), res)
    assert res.response_headers == {"x-pin": session_token(A)}


@pytest.mark.parametrize("profile,prefill,expected", [
    ("prefill", [C], {"x-session-token-prefill": session_token(C)}),
    ("prefill", None, {}),
    ("", [C], {"x-session-token-prefill": session_token(A)}),
], ids=["prefill-pick", "prefill-not-run", "primary"])
def test_encoded_scorer_writes_the_pick_of_its_profile(profile: str, prefill: list[Any] | None,
                                                       expected: dict[str, str]) -> None:
    scorer = make(SessionAffinityScorer, {"headerName": "x-session-token-prefill", "profileName": profile})
    res = result([A], prefill)
    scorer.pre_request(req(), res)
    assert res.response_headers == expected


# -- scorer: session_id_header ----------------------------------------------------------------------------------

def sid_scorer(clock: Clock | None = None, **raw: Any) -> SessionAffinityScorer:
    return make(SessionAffinityScorer, {"algorithm": "session_id_header", **raw}, clock=clock or Clock())


def test_session_id_scorer_binds_and_spreads_sessions_over_the_least_bound() -> None:
    scorer = sid_scorer()
    assert scorer.score(CycleState(), req(), [A, B]) == [0.0, 0.0]  # no session: no preference
    assert run(scorer, {"x-session-token": "s1"}, [A, B]) == [1.0, 0.0]
    assert run(scorer, {"x-session-token": "s2"}, [A, B]) == [0.0, 1.0]  # A holds one session, B none
    assert run(scorer, {"x-session-token": "s3"}, [A, B, C]) == [0.0, 0.0, 1.0]
    for _ in range(3):
        assert run(scorer, {"x-session-token": "s1"}, [A, B, C]) == [1.0, 0.0, 0.0]
        assert run(scorer, {"x-session-token": "s2"}, [C, B, A]) == [0.0, 1.0, 0.0]
    assert [scorer.bindings.count(k) for k in ("ns/pod-a", "ns/pod-b", "ns/pod-c")] == [1, 1, 1]


@pytest.mark.parametrize("threshold,moves_after", [(0, 3), (1, 1), (2, 2)], ids=["default-3", "one", "two"])
def test_session_id_scorer_moves_only_after_miss_threshold_absences(threshold: int, moves_after: int) -> None:
    scorer = sid_scorer(missThreshold=threshold)
    run(scorer, {"x-session-token": "s"}, [A, B])
    for i in range(1, moves_after + 1):
        assert scorer.bindings.bound("s") == "ns/pod-a"
        assert run(scorer, {"x-session-token": "s"}, [B, C]) == [1.0, 0.0]  # steered to the least bound now
    assert scorer.bindings.bound("s") == "ns/pod-b"
    assert (scorer.bindings.count("ns/pod-a"), scorer.bindings.count("ns/pod-b")) == (0, 1)


def test_session_id_scorer_presence_restarts_the_miss_count() -> None:
    scorer = sid_scorer(missThreshold=2)
    run(scorer, {"x-session-token": "s"}, [A, B])
    run(scorer, {"x-session-token": "s"}, [B])            # miss 1
    run(scorer, {"x-session-token": "s"}, [A, B])         # back: count restarts
    run(scorer, {"x-session-token": "s"}, [B])            # miss 1 again
    assert scorer.bindings.bound("s") == "ns/pod-a"
    run(scorer, {"x-session-token": "s"}, [B])            # miss 2: moves
    assert scorer.bindings.bound("s") == "ns/pod-b"


def test_session_id_scorer_keeps_the_binding_when_the_picker_chose_another_present_endpoint() -> None:
    scorer = sid_scorer(missThreshold=1)
    run(scorer, {"x-session-token": "s"}, [A, B])
    assert run(scorer, {"x-session-token": "s"}, [A, B], picked=B) == [1.0, 0.0]
    assert scorer.bindings.bound("s") == "ns/pod-a"


def test_session_id_scorer_binds_the_pick_of_its_profile_and_writes_nothing() -> None:
    scorer = sid_scorer(profileName="prefill")
    request = req(headers={"x-session-token": "s"})
    res = result([A], [C])
    scorer.pre_request(request, res)
    assert scorer.bindings.bound("s") == "ns/pod-c" and res.response_headers == {}


def test_session_id_scorer_evicts_unused_bindings_after_the_ttl() -> None:
    clock = Clock()
    scorer = sid_scorer(clock, evictionTtlSeconds=60, evictionSweepSeconds=10)
    run(scorer, {"x-session-token": "old"}, [A, B])
    clock.now += 30
    run(scorer, {"x-session-token": "kept"}, [A, B])
    clock.now += 40                                     # "old" unused for 70 s, "kept" for 40 s
    assert scorer.bindings.bound("kept") == "ns/pod-b"
    assert scorer.bindings.bound("old") is None and scorer.bindings.count("ns/pod-a") == 0
    assert len(scorer.bindings) == 1


# -- filter ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("headers,expected", [
    ({"x-session-token": session_token(B)}, ["pod-b"]),
    ({}, ["pod-a", "pod-b"]),
    ({"x-session-token": "%%%"}, ["pod-a", "pod-b"]),
    ({"x-session-token": session_token(C)}, ["pod-a", "pod-b"]),
], ids=["pinned", "no-token", "undecodable", "pod-gone"])
def test_encoded_filter_keeps_the_token_endpoint_or_everything(headers: dict[str, str], expected: list[str]) -> None:
    flt = make(SessionAffinityFilter)
    assert names(flt.filter(CycleState(), req(headers=headers), [A, B])) == expected


def test_encoded_filter_writes_its_header_for_its_profile() -> None:
    flt = make(SessionAffinityFilter, {"profileName": "prefill",
                                       "encodedEndpointHeaderConfig": {"header": "x-session-token-prefill"}})
    res = result([A], [C])
    flt.pre_request(req(), res)
    assert res.response_headers == {"x-session-token-prefill": session_token(C)}
    request = req(headers={"x-session-token-prefill": session_token(C)})
    assert names(flt.filter(CycleState(), request, [A, B, C])) == ["pod-c"]


def test_session_id_filter_passes_unbound_pins_bound_and_rebinds_after_absence() -> None:
    flt = make(SessionAffinityFilter, {"strategy": "session_id"}, clock=Clock())
    request = req(headers={"x-session-id": "s"})
    assert names(flt.filter(CycleState(), request, [A, B])) == ["pod-a", "pod-b"]
    flt.pre_request(request, result([B]))
    assert names(flt.filter(CycleState(), request, [A, B, C])) == ["pod-b"]
    assert names(flt.filter(CycleState(), req(headers={"x-session-id": "other"}), [A, B])) == ["pod-a", "pod-b"]
    assert names(flt.filter(CycleState(), request, [A, C])) == ["pod-a", "pod-c"]  # pod-b gone: everything
    flt.pre_request(request, result([C]))
    assert names(flt.filter(CycleState(), request, [A, B, C])) == ["pod-c"]
    assert flt.pre_request(req(), result([A])) is None and len(flt.bindings) == 1  # no session: nothing bound


def test_session_id_filter_reads_sources_in_order_including_a_producer_attribute() -> None:
    producer = make(SessionIdProducer, {"cookieName": "sess"}, name="session-id-producer")
    flt = make(SessionAffinityFilter, {"strategy": "session_id", "sessionIdConfig": {
        "sources": [{"header": "X-Agent"}, {"attribute": "session-id-producer"}]}}, clock=Clock())
    bind_all(producer, flt)
    by_cookie = req(headers={"cookie": "a=1; sess=s1"})
    cyc = CycleState()
    producer.produce(cyc, by_cookie, [A, B])
    flt.pre_request(by_cookie, result([A], cyc=cyc))
    assert flt.bindings.bound("s1") == "ns/pod-a"
    cyc = CycleState()
    producer.produce(cyc, by_cookie, [A, B])
    assert names(flt.filter(cyc, by_cookie, [B, A])) == ["pod-a"]
    both = req(headers={"x-agent": "s2", "cookie": "sess=s1"})
    cyc = CycleState()
    producer.produce(cyc, both, [A, B])
    assert names(flt.filter(cyc, both, [B, A])) == ["pod-b", "pod-a"]  # the header wins and "s2" is unbound


def test_session_id_filter_attribute_source_gets_a_default_producer_from_the_loader() -> None:
    text = """
plugins:
- type: session-affinity-filter
  parameters: {strategy: session_id, sessionIdConfig: {sources: [{attribute: session-id-producer}]}}
"""
    pipeline = build_pipeline(*load_raw(text), registry())
    producer = pipeline.handle.plugin("session-id-producer")
    assert isinstance(producer, SessionIdProducer) and producer.header == "x-session-id"
    assert producer in pipeline.scheduler.producers


@pytest.mark.parametrize("attribute", ["agent-identity", "inflight-load-producer"])
def test_session_id_filter_refuses_attributes_epp_does_not_produce(attribute: str) -> None:
    text = f"""
plugins:
- type: session-affinity-filter
  parameters: {{strategy: session_id, sessionIdConfig: {{sources: [{{attribute: {attribute}}}]}}}}
"""
    with pytest.raises(ConfigError, match=f"request attribute '{attribute}'"):
        build_pipeline(*load_raw(text), registry())


# -- producer --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("header,name,expected", [
    ("a=1; llm-d-session=abc; b=2", "llm-d-session", "abc"),
    ("llm-d-session=first;llm-d-session=second", "llm-d-session", "first"),
    ("xllm-d-session=no; flag", "llm-d-session", ""),
    ("", "llm-d-session", ""),
], ids=["middle", "first-wins", "absent", "empty"])
def test_cookie_value(header: str, name: str, expected: str) -> None:
    assert cookie_value(header, name) == expected


def test_producer_publishes_session_and_binding_of_the_primary_pick() -> None:
    producer = make(SessionIdProducer, {"headerName": " X-My-Session "}, clock=Clock())
    assert producer.header == "x-my-session"
    cyc = CycleState()
    producer.produce(cyc, req(), [A, B])
    assert cyc == {}
    request = req(headers={"x-my-session": " s1 "})
    producer.produce(cyc, request, [A, B])
    assert producer.session_id(cyc) == "s1" and producer.bound_endpoint(cyc) is None
    producer.pre_request(request, result([B], [A]))
    cyc = CycleState()
    producer.produce(cyc, request, [A, B])
    assert producer.bound_endpoint(cyc) == B.hostport


def test_producer_bindings_expire_after_ttl_since_last_write_and_are_size_bounded() -> None:
    clock = Clock()
    producer = make(SessionIdProducer, {"headerName": "x-session-id", "ttl": "1m", "lruSize": 2}, clock=clock)

    def bound(sid: str) -> str | None:
        cyc = CycleState()
        producer.produce(cyc, req(headers={"x-session-id": sid}), [A])
        return producer.bound_endpoint(cyc)

    for sid in ("s1", "s2"):
        producer.pre_request(req(headers={"x-session-id": sid}), result([A]))
    clock.now += 50
    producer.pre_request(req(headers={"x-session-id": "s1"}), result([A]))   # rewrite refreshes s1
    clock.now += 20
    assert (bound("s1"), bound("s2")) == (A.hostport, None)
    producer.pre_request(req(headers={"x-session-id": "s3"}), result([B]))
    producer.pre_request(req(headers={"x-session-id": "s4"}), result([C]))
    assert (bound("s1"), bound("s3"), bound("s4")) == (None, B.hostport, C.hostport)  # s1 least recently used
