"""llm-d-router's header and metadata names on the ext_proc front end, next to their deprecated Gateway API
Inference Extension aliases (a real ExtProcServer and grpc.aio client, both transports; Envoy in
``test_envoy_header_aliases``): each input read under its current name, under its deprecated name, and with both
present (the current name wins); the routing decision and a drop reason written under both names."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import orjson
import pytest

from epp.extproc.protocol import pb
from epp.flowcontrol.policies import slo_ttft_ms
from epp.framework.plugins import SchedulingResult
from epp.framework.request import InferenceRequest
from epp.headers import (
    DESTINATION_HEADER,
    DROPPED_REASON_HEADER,
    FAIRNESS_ID_HEADER,
    HEADER_ALIASES,
    MODEL_REWRITE_HEADER,
    OBJECTIVE_HEADER,
    SERVED_HEADER,
    SLO_TTFT_HEADER,
    SUBSET_HEADER,
    HeaderTrust,
)

from .helpers import (
    BUFFERED,
    CHAT,
    FULL_DUPLEX,
    make_director,
    request_body,
    request_headers,
    response_headers,
    set_headers,
    specs,
)

OLD_DESTINATION = "x-gateway-destination-endpoint"  # literal: the name existing Envoy/Gateway setups route on
WHICH = ["current", "deprecated", "both"]
PRIORITIES = {"gold": 7, "bronze": 3}


class Seen:
    """PreRequest hook: each routed request as the front end parsed it."""

    type_name: ClassVar[str] = "test-seen"

    def __init__(self) -> None:
        self.name = "seen"
        self.requests: list[InferenceRequest] = []

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self.requests.append(request)


def under(name: str, which: str, current: str, deprecated: str) -> dict[str, str]:
    """``current`` under ``name``, ``deprecated`` under its alias, or both."""
    out = {}
    if which != "deprecated":
        out[name] = current
    if which != "current":
        out[HEADER_ALIASES[name]] = deprecated
    return out


def expected(which: str, current: str, deprecated: str) -> str:
    return deprecated if which == "deprecated" else current


INPUTS = [
    pytest.param(FAIRNESS_ID_HEADER, "tenant-new", "tenant-old", lambda r: r.fairness_id, id="fairness-id"),
    pytest.param(OBJECTIVE_HEADER, "gold", "bronze", lambda r: r.objective, id="objective"),
    pytest.param(MODEL_REWRITE_HEADER, "target-new", "target-old", lambda r: r.target_model, id="model-rewrite"),
    pytest.param(SLO_TTFT_HEADER, "250", "900", lambda r: str(slo_ttft_ms(r.headers)), id="slo-ttft-ms"),
]


async def route(serve: Any, headers: dict[str, str]) -> tuple[InferenceRequest, dict[str, str], bytes]:
    """One full-duplex request with ``headers``: what EPP parsed, the routing headers it set, the body it sent on."""
    director = make_director(specs(2), header_trust=HeaderTrust([MODEL_REWRITE_HEADER]))
    for name, priority in PRIORITIES.items():
        director.datastore.objectives.set(name, priority)
    seen = Seen()
    director.pipeline.pre_request.append(seen)
    _, client = await serve(director)
    head, body = await client.exchange([request_headers(headers=headers), request_body(CHAT)], 2)
    [request] = seen.requests
    sent_on = body.request_body.response.body_mutation.streamed_response.body
    return request, set_headers(head.request_headers.response), sent_on


@pytest.mark.parametrize("which", WHICH)
@pytest.mark.parametrize("name, current, deprecated, read", INPUTS)
async def test_request_header_current_name_then_deprecated_alias(
        serve, name: str, current: str, deprecated: str, read: Callable[[InferenceRequest], str], which: str) -> None:
    request, _, body = await route(serve, under(name, which, current, deprecated))
    assert read(request) == expected(which, current, deprecated)
    assert orjson.loads(body)["model"] == request.target_model  # the rewrite (if any) reached the upstream body


@pytest.mark.parametrize("which", WHICH)
async def test_the_objective_named_by_either_name_gives_its_priority(serve, which: str) -> None:
    request, _, _ = await route(serve, under(OBJECTIVE_HEADER, which, "gold", "bronze"))
    assert request.priority == PRIORITIES[expected(which, "gold", "bronze")]


def with_subset(msg: pb.ProcessingRequest, key: str, endpoints: list[str]) -> pb.ProcessingRequest:
    lst = msg.metadata_context.filter_metadata["envoy.lb.subset_hint"].fields[key].list_value
    lst.SetInParent()
    for hostport in endpoints:
        lst.values.add(string_value=hostport)
    return msg


@pytest.mark.parametrize("which", WHICH)
async def test_subset_hint_current_key_then_deprecated_key(serve, which: str) -> None:
    _, client = await serve(make_director(specs(4)))
    allowed = {"10.0.0.3:8000"} if which == "deprecated" else {"10.0.0.2:8000"}
    for _ in range(6):
        msg = request_headers()
        if which != "deprecated":
            with_subset(msg, SUBSET_HEADER, ["10.0.0.2:8000"])
        if which != "current":
            with_subset(msg, HEADER_ALIASES[SUBSET_HEADER], ["10.0.0.3:8000"])
        [head] = await client.exchange([msg, request_body(CHAT)], 1)
        assert set_headers(head.request_headers.response)[DESTINATION_HEADER] in allowed


@pytest.mark.parametrize("which", WHICH)
async def test_served_endpoint_current_key_then_deprecated_key(serve, which: str) -> None:
    director = make_director(specs(3), waiting={"ep0": 0, "ep1": 5, "ep2": 5})
    _, client = await serve(director)
    endpoints = director.datastore.endpoints()
    call = client.open()
    await call.write(request_headers())
    await call.write(request_body(CHAT))
    await call.read(), await call.read()
    assert [ep.inflight_requests for ep in endpoints] == [1, 0, 0]
    msg = response_headers()
    lb = msg.metadata_context.filter_metadata["envoy.lb"].fields
    if which != "deprecated":
        lb[SERVED_HEADER].string_value = "10.0.0.2:8000"
    if which != "current":
        lb[HEADER_ALIASES[SERVED_HEADER]].string_value = "10.0.0.3:8000"
    await call.write(msg)
    await call.read()
    assert [ep.inflight_requests for ep in endpoints] == ([0, 0, 1] if which == "deprecated" else [0, 1, 0])
    call.cancel()


@pytest.mark.parametrize("case", ["full-duplex", "buffered", "no-body"])
async def test_the_destination_is_written_under_both_names_and_spoofs_of_either_name_are_dropped(
        serve, case: str) -> None:
    _, client = await serve(make_director(specs(1)))
    spoofed = {name: "6.6.6.6:80" for base in (DESTINATION_HEADER, SERVED_HEADER, SUBSET_HEADER)
               for name in (base, HEADER_ALIASES[base])}
    if case == "no-body":
        [reply] = await client.exchange([request_headers("/v1/models", spoofed, eos=True)], 1)
    else:
        mode = FULL_DUPLEX if case == "full-duplex" else BUFFERED
        replies = await client.exchange([request_headers(headers=spoofed, mode=mode), request_body(CHAT)], 2)
        reply = replies[0] if mode == FULL_DUPLEX else replies[1]
    common = reply.request_headers.response if case != "buffered" else reply.request_body.response
    assert set_headers(common)[DESTINATION_HEADER] == set_headers(common)[OLD_DESTINATION] == "10.0.0.1:8000"
    lb = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb[DESTINATION_HEADER].string_value == lb[OLD_DESTINATION].string_value == "10.0.0.1:8000"
    assert set(common.header_mutation.remove_headers) == {
        SERVED_HEADER, HEADER_ALIASES[SERVED_HEADER], SUBSET_HEADER, HEADER_ALIASES[SUBSET_HEADER]}


async def test_a_dropped_request_says_why_under_both_names(serve) -> None:
    _, client = await serve(make_director(specs(2)))
    [reply] = await client.exchange([with_subset(request_headers(), SUBSET_HEADER, []), request_body(CHAT)], 1)
    assert reply.immediate_response.status.code == 503  # an empty subset: no candidate
    headers = {o.header.key: o.header.raw_value for o in reply.immediate_response.headers.set_headers}
    assert headers[DROPPED_REASON_HEADER] == headers[HEADER_ALIASES[DROPPED_REASON_HEADER]] == b"rejected-no-endpoints"
