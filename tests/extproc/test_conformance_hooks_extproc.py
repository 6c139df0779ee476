"""The conformance suite's test hooks over ext_proc: ``test-epp-endpoint-selection`` steers the pick and
``x-conformance-test-served-endpoint`` reports what Envoy served, on the raw protocol and behind a real Envoy."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from epp.extproc.protocol import RESPONSE_HEADERS_MARKER
from epp.plugins.requestcontrol.destination_endpoint_served_verifier import MISSING_LB, MISSING_SERVED, RESULT_HEADER

from .helpers import CHAT, make_director, request_body, request_headers, response_headers, set_headers, specs
from .test_envoy import chat, sim_specs

CONFORMANCE = (Path(__file__).parent.parent / "fixtures" / "conformance-configs" /
               "conformance-plugins.yaml").read_text()  # the conformance suite's ConfigMap, as it ships


async def _answer_headers(client, selection: str,  # type: ignore[no-untyped-def]
                          **served: str) -> tuple[dict[str, str], dict[str, str]]:
    """One request through the raw protocol: (the routing reply's headers, the response-headers reply's)."""
    call = client.open()
    await call.write(request_headers(headers={"test-epp-endpoint-selection": selection}))
    await call.write(request_body(CHAT))
    routed = await call.read()
    await call.read()  # the body, streamed back
    await call.write(response_headers(**served))
    reply = await call.read()
    call.cancel()
    return set_headers(routed.request_headers.response), set_headers(reply.response_headers.response)


@pytest.mark.parametrize("served, expected", [
    ({"served": "10.0.0.3:8000"}, "10.0.0.3:8000"),
    ({"served": "10.0.0.3:8000", "served_key": "x-llm-d-router-destination-endpoint-served"}, "10.0.0.3:8000"),
    ({"upstream": "10.0.0.3:8000"}, "10.0.0.3:8000"),
    ({}, MISSING_LB),
], ids=["envoy-lb", "envoy-lb-current-key", "upstream-attribute", "nothing-reported"])
async def test_selection_header_picks_and_the_served_endpoint_is_reported(serve, served, expected) -> None:
    director = make_director(specs(4), CONFORMANCE)
    _, client = await serve(director)
    routing, answer = await _answer_headers(client, "10.0.0.3:8000", **served)
    assert routing["x-gateway-destination-endpoint"] == "10.0.0.3:8000"
    assert answer == {RESPONSE_HEADERS_MARKER: "true", RESULT_HEADER: expected}


async def test_envoy_lb_metadata_without_the_served_key_is_the_second_failure_text(serve) -> None:
    director = make_director(specs(2), CONFORMANCE)
    _, client = await serve(director)
    call = client.open()
    await call.write(request_headers(headers={"test-epp-endpoint-selection": "10.0.0.2"}))
    await call.write(request_body(CHAT))
    await call.read(), await call.read()
    msg = response_headers()
    msg.metadata_context.filter_metadata["envoy.lb"].fields["x-gateway-destination-endpoint"].string_value = "x"
    await call.write(msg)
    reply = await call.read()
    call.cancel()
    assert set_headers(reply.response_headers.response)[RESULT_HEADER] == MISSING_SERVED


@pytest.mark.envoy
async def test_behind_envoy_each_request_lands_on_the_endpoint_its_header_names(stack, sims) -> None:
    servers = await sims(3)
    director = make_director(sim_specs(servers), CONFORMANCE)
    st = await stack(director)
    for target in (servers[2], servers[0], servers[1], servers[2]):
        hostport = f"127.0.0.1:{target.port}"
        status, headers, body = await st.post("/v1/chat/completions", chat(),
                                              {"test-epp-endpoint-selection": hostport})
        assert status == 200, body
        assert headers["x-served-by"] == hostport
        assert headers[RESULT_HEADER] == hostport
    status, headers, body = await st.post("/v1/chat/completions", chat())  # no header: no candidate
    assert status == 429 and orjson.loads(body)["error"]["message"]
    assert RESULT_HEADER not in headers
