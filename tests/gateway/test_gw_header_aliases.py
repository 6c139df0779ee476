"""llm-d-router's header names on the HTTP gateway, next to their deprecated Gateway API Inference Extension
aliases (both front ends and upstream clients, a simulated vLLM server behind a recording tap): each input read
under its current name, under its deprecated name, and with both present (the current name wins), in any case;
EPP's own headers, under either name, never reach the model server; a drop reason goes out under both names."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from epp.config.loader import DEFAULT_CONFIG_TEXT
from epp.flowcontrol.policies import slo_ttft_ms
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
    header_names,
)

from .helpers import Stack, Tap, chat, sim, spec_for

WHICH = ["current", "deprecated", "both"]
PRIORITIES = {"gold": 7, "bronze": 3}
ADAPTERS = ["target-new", "target-old"]  # rewrite targets the simulator serves (another name is a 404)
ALIAS = "alias"  # the model the client names (served too, so that a request without a rewrite succeeds)


def under(name: str, which: str, current: str, deprecated: str) -> dict[str, str]:
    """``current`` under ``name``, ``deprecated`` under its alias, or both; names in title case, as a client may
    send them (the gateway matches them case-insensitively)."""
    out = {}
    if which != "deprecated":
        out[name.title()] = current
    if which != "current":
        out[HEADER_ALIASES[name].title()] = deprecated
    return out


def expected(which: str, current: str, deprecated: str) -> str:
    return deprecated if which == "deprecated" else current


async def pool(sims: Any, stack: Any, taps: Any) -> tuple[Stack, Tap]:
    [server] = await sims(sim(lora_adapters=[ALIAS, *ADAPTERS]))
    tap = await taps(server)
    st = await stack(DEFAULT_CONFIG_TEXT, [spec_for(server, port=tap.port)])
    st.director.header_trust = HeaderTrust([MODEL_REWRITE_HEADER])  # the rewrite comes from a trusted gateway
    for name, priority in PRIORITIES.items():
        st.datastore.objectives.set(name, priority)
    return st, tap


async def send(st: Stack, headers: dict[str, str]) -> InferenceRequest:
    status, body = await st.post("/v1/chat/completions", chat(max_tokens=2) | {"model": ALIAS}, headers=headers)
    assert status == 200, body
    assert body["model"] == ALIAS  # the client sees its own model name, whichever header rewrote it
    request, _, _ = st.recorder.done[-1]
    return request


INPUTS = [
    pytest.param(FAIRNESS_ID_HEADER, "tenant-new", "tenant-old", lambda r: r.fairness_id, id="fairness-id"),
    pytest.param(OBJECTIVE_HEADER, "gold", "bronze", lambda r: r.objective, id="objective"),
    pytest.param(MODEL_REWRITE_HEADER, *ADAPTERS, lambda r: r.target_model, id="model-rewrite"),
    pytest.param(SLO_TTFT_HEADER, "250", "900", lambda r: str(slo_ttft_ms(r.headers)), id="slo-ttft-ms"),
]


@pytest.mark.parametrize("which", WHICH)
@pytest.mark.parametrize("name, current, deprecated, read", INPUTS)
async def test_request_header_current_name_then_deprecated_alias(
        sims, stack, taps, name: str, current: str, deprecated: str, read: Callable[[InferenceRequest], str],
        which: str) -> None:
    st, tap = await pool(sims, stack, taps)
    request = await send(st, under(name, which, current, deprecated))
    assert read(request) == expected(which, current, deprecated)
    assert tap.records[-1].body["model"] == request.target_model  # the rewrite (if any) reached the upstream


@pytest.mark.parametrize("which", WHICH)
async def test_the_objective_named_by_either_name_gives_its_priority(sims, stack, taps, which: str) -> None:
    st, _ = await pool(sims, stack, taps)
    request = await send(st, under(OBJECTIVE_HEADER, which, "gold", "bronze"))
    assert request.priority == PRIORITIES[expected(which, "gold", "bronze")]


async def test_epp_headers_under_either_name_do_not_reach_the_model_server(sims, stack, taps) -> None:
    st, tap = await pool(sims, stack, taps)
    spoofed = [name for base in (FAIRNESS_ID_HEADER, OBJECTIVE_HEADER, DESTINATION_HEADER, SERVED_HEADER,
                                 SUBSET_HEADER) for name in header_names(base)]
    headers = {name.title(): "6.6.6.6:80" for name in spoofed} | under(MODEL_REWRITE_HEADER, "both", *ADAPTERS)
    request = await send(st, headers)
    assert request.target_model == "target-new"
    assert not {*spoofed, *header_names(MODEL_REWRITE_HEADER)} & set(tap.records[-1].headers)


async def test_a_dropped_request_says_why_under_both_names(stack) -> None:
    st = await stack(DEFAULT_CONFIG_TEXT, [])
    async with st.session.post(st.url + "/v1/chat/completions", json=chat()) as resp:
        assert resp.status == 503
        names = header_names(DROPPED_REASON_HEADER)
        assert [resp.headers[name] for name in names] == ["rejected-no-endpoints"] * 2
