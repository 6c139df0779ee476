"""Header trust through ext_proc (both transports; raw protocol, then a real Envoy in front of recording
upstreams): a client's trusted-only headers (model rewrite, data-parallel rank, encoder and prefiller hosts,
subset) and EPP-only ones (destination, served) change nothing, and the routing reply removes them, and the
client-settable headers EPP consumes (tenant, objective), from what the model server gets; with the operator's
trust the trusted-only ones are honoured, EPP's own values still winning."""

from __future__ import annotations

import hashlib
from typing import ClassVar

import orjson
import pytest

from epp.extproc.protocol import DESTINATION_KEYS, pb
from epp.framework.endpoint import ROLE_LABEL
from epp.framework.plugins import SchedulingResult
from epp.framework.request import InferenceRequest
from epp.headers import (
    DATA_PARALLEL_HEADER,
    DESTINATION_HEADER,
    ENCODER_HEADER,
    FAIRNESS_ID_HEADER,
    HEADER_RULES,
    MODEL_REWRITE_HEADER,
    OBJECTIVE_HEADER,
    PREFILLER_HEADER,
    SERVED_HEADER,
    SUBSET_HEADER,
    HeaderTrust,
    Trust,
    header_names,
)

from .helpers import (
    BUFFERED,
    CHAT,
    FULL_DUPLEX,
    EchoServer,
    make_director,
    request_body,
    request_headers,
    set_headers,
    specs,
)
from .test_envoy import PD_CONFIG, chat, echo_specs

ALL_TRUSTED = HeaderTrust(r.name for r in HEADER_RULES if r.trust is Trust.TRUSTED)
SIDECAR = {DATA_PARALLEL_HEADER: "6.6.6.6:1", ENCODER_HEADER: "6.6.6.6:2,6.6.6.6:3", PREFILLER_HEADER: "6.6.6.6:4"}
TENANT = {name: value for base, value in ((FAIRNESS_ID_HEADER, "tenant-a"), (OBJECTIVE_HEADER, "gold"))
          for name in header_names(base)}
REWRITE = set(header_names(MODEL_REWRITE_HEADER))
SUBSET = set(header_names(SUBSET_HEADER))
EPP_ONLY = {name for base in (DESTINATION_HEADER, SERVED_HEADER) for name in header_names(base)}


def spoofed(subset: str = "6.6.6.6") -> dict[str, str]:
    """Every trusted-only and EPP-only header under every name. A subset honoured from here would leave no pool
    endpoint (503), so a routed request shows it was ignored."""
    return ({name: "target" for name in REWRITE} | {name: subset for name in SUBSET} | SIDECAR
            | {name: "6.6.6.6:80" for name in EPP_ONLY})


class Seen:
    """PreRequest hook: each routed request as the front end parsed it."""

    type_name: ClassVar[str] = "test-seen"

    def __init__(self) -> None:
        self.name = "seen"
        self.requests: list[InferenceRequest] = []

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self.requests.append(request)


async def route(serve, director, headers: dict[str, str], mode: int = FULL_DUPLEX,  # type: ignore[no-untyped-def]
                subset: list[str] | None = None) -> tuple[InferenceRequest | None, pb.ProcessingResponse, bytes | None]:
    """One request: what EPP parsed, its routing reply (or ImmediateResponse) and the body it sent upstream (None:
    the client's body, unchanged)."""
    seen = Seen()
    director.pipeline.pre_request.append(seen)
    _, client = await serve(director)
    replies = await client.exchange([request_headers(headers=headers, mode=mode, subset=subset), request_body(CHAT)], 2)
    reply = replies[0] if mode == FULL_DUPLEX or replies[0].HasField("immediate_response") else replies[1]
    request = seen.requests[-1] if seen.requests else None
    if reply.HasField("immediate_response") or mode == BUFFERED:
        body = reply.request_body.response.body_mutation.body or None
    else:
        body = replies[1].request_body.response.body_mutation.streamed_response.body
    return request, reply, body


def common(reply: pb.ProcessingResponse) -> pb.CommonResponse:
    return reply.request_headers.response if reply.HasField("request_headers") else reply.request_body.response


@pytest.mark.parametrize("mode", [FULL_DUPLEX, BUFFERED], ids=["full-duplex", "buffered"])
async def test_spoofed_trusted_only_headers_change_nothing(serve, mode: int) -> None:
    request, reply, body = await route(serve, make_director(specs(2)), spoofed() | TENANT, mode)
    assert request is not None, reply  # routed: the spoofed subset did not empty the candidates
    assert request.target_model == "m" and body in (None, CHAT)  # not rewritten
    assert request.fairness_id == "tenant-a" and request.objective == "gold"  # client-settable: read
    assert not set(spoofed()) & set(request.headers)  # plugins never see them
    mutation = common(reply).header_mutation
    assert set(mutation.remove_headers) == set(spoofed()) - set(DESTINATION_KEYS) | set(TENANT)
    assert set_headers(common(reply))[DESTINATION_HEADER] in {"10.0.0.1:8000", "10.0.0.2:8000"}
    assert not (set(spoofed()) - set(DESTINATION_KEYS)) & set(set_headers(common(reply)))


async def test_a_request_without_a_body_strips_them_too(serve) -> None:
    _, client = await serve(make_director(specs(1)))
    [reply] = await client.exchange([request_headers("/v1/models", spoofed() | TENANT, eos=True)], 1)
    assert set(reply.request_headers.response.header_mutation.remove_headers) == (
        set(spoofed()) - set(DESTINATION_KEYS) | set(TENANT))


@pytest.mark.parametrize("mode", [FULL_DUPLEX, BUFFERED], ids=["full-duplex", "buffered"])
async def test_trusted_headers_are_honoured(serve, mode: int) -> None:
    headers = spoofed() | {SUBSET_HEADER: "10.0.0.2"}  # the current name wins over the alias's 6.6.6.6
    request, reply, body = await route(serve, make_director(specs(3), header_trust=ALL_TRUSTED), headers, mode)
    assert request is not None and request.target_model == "target"
    assert body is not None and orjson.loads(body)["model"] == "target"
    assert set_headers(common(reply))[DESTINATION_HEADER] == "10.0.0.2:8000"  # the trusted subset
    # Consumed (rewrite, subset) and EPP-only headers are removed; the sidecar's pass through Envoy untouched.
    assert set(common(reply).header_mutation.remove_headers) == REWRITE | SUBSET | (EPP_ONLY - set(DESTINATION_KEYS))


async def test_a_trusted_subset_header_with_no_pool_endpoint_is_503(serve) -> None:
    _, reply, _ = await route(serve, make_director(specs(2), header_trust=ALL_TRUSTED), {SUBSET_HEADER: "6.6.6.6"})
    assert reply.immediate_response.status.code == 503


async def test_envoys_subset_hint_wins_over_a_trusted_subset_header(serve) -> None:
    director = make_director(specs(3), header_trust=ALL_TRUSTED)
    _, reply, _ = await route(serve, director, {SUBSET_HEADER: "10.0.0.2"}, subset=["10.0.0.3:8000"])
    assert set_headers(common(reply))[DESTINATION_HEADER] == "10.0.0.3:8000"


async def test_epps_own_sidecar_header_wins_over_a_trusted_one(serve) -> None:
    roles = [{ROLE_LABEL: "prefill"}, {ROLE_LABEL: "decode"}]
    director = make_director(specs(2, labels=roles), PD_CONFIG, header_trust=ALL_TRUSTED)
    _, reply, _ = await route(serve, director, {PREFILLER_HEADER: "6.6.6.6:4"})
    assert set_headers(common(reply))[PREFILLER_HEADER] == "10.0.0.1:8000"
    assert PREFILLER_HEADER not in common(reply).header_mutation.remove_headers


# -- through a real Envoy ---------------------------------------------------------------------------------------

def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.envoy
@pytest.mark.parametrize("mode", ["full-duplex", "buffered"])
async def test_through_envoy_spoofed_headers_never_reach_the_model_server(stack, echoes, mode: str) -> None:
    pool, trap = await echoes(2)
    st = await stack(make_director(echo_specs([pool])), mode=mode)
    raw = orjson.dumps(chat())
    status, headers, out = await st.post("/v1/chat/completions", raw, spoofed() | TENANT)
    assert status == 200 and headers["x-served-by"] == pool.hostport, out
    answer = orjson.loads(out)
    assert answer["sha256"] == _sha(raw)  # the body reached the model server unchanged: no rewrite
    seen = answer["headers"]
    assert not (set(spoofed()) - set(DESTINATION_KEYS) | set(TENANT)) & set(seen)
    assert all(seen[name] == pool.hostport for name in DESTINATION_KEYS)
    assert trap.hits == 0


@pytest.mark.envoy
async def test_through_envoy_trusted_headers_are_honoured(stack, echoes) -> None:
    pool: list[EchoServer] = await echoes(1)
    st = await stack(make_director(echo_specs(pool), header_trust=ALL_TRUSTED))
    body = chat()
    status, _, out = await st.post("/v1/chat/completions", orjson.dumps(body), spoofed(subset="127.0.0.1"))
    assert status == 200, out
    answer = orjson.loads(out)
    assert answer["sha256"] == _sha(orjson.dumps({**body, "model": "target"}))  # rewritten upstream
    seen = answer["headers"]
    assert {name: seen.get(name) for name in SIDECAR} == SIDECAR
    assert not (REWRITE | SUBSET | (EPP_ONLY - set(DESTINATION_KEYS))) & set(seen)
    status, _, _ = await st.post("/v1/chat/completions", orjson.dumps(body), {SUBSET_HEADER: "6.6.6.6"})
    assert status == 503  # the trusted subset allows no pool endpoint
