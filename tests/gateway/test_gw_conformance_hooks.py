"""The conformance suite's test hooks through the HTTP gateway: the selection header steers the pick and the
answer names the endpoint the gateway proxied to, for JSON and streamed answers."""

from __future__ import annotations

from pathlib import Path

import orjson

from epp.plugins.requestcontrol.destination_endpoint_served_verifier import RESULT_HEADER

from .helpers import MODEL, chat, sim, spec_for

CONFORMANCE = (Path(__file__).parent.parent / "fixtures" / "conformance-configs" /
               "conformance-plugins.yaml").read_text()  # the conformance suite's ConfigMap, as it ships


async def test_selection_header_steers_and_the_served_endpoint_comes_back(sims, stack) -> None:
    servers = await sims(*[sim() for _ in range(3)])
    st = await stack(CONFORMANCE, [spec_for(s) for s in servers])
    for target in (servers[1], servers[2], servers[1]):
        hostport = f"127.0.0.1:{target.port}"
        async with st.openai() as client:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                extra_headers={"test-epp-endpoint-selection": hostport})
        assert raw.headers[RESULT_HEADER] == hostport
        assert raw.parse().choices[0].message.content
    served = [endpoint.port for _, endpoint, _ in st.recorder.done if endpoint is not None]
    assert served == [servers[1].port, servers[2].port, servers[1].port]


async def test_streamed_answers_carry_the_header_too(sims, stack) -> None:
    servers = await sims(*[sim() for _ in range(2)])
    st = await stack(CONFORMANCE, [spec_for(s) for s in servers])
    hostport = f"127.0.0.1:{servers[0].port}"
    async with st.session.post(st.url + "/v1/chat/completions", data=orjson.dumps(chat(stream=True)),
                               headers={"test-epp-endpoint-selection": hostport}) as resp:
        assert resp.status == 200
        assert resp.headers[RESULT_HEADER] == hostport
        assert b"data: [DONE]" in await resp.read()


async def test_without_the_header_no_endpoint_is_a_candidate(sims, stack) -> None:
    servers = await sims(sim())
    st = await stack(CONFORMANCE, [spec_for(s) for s in servers])
    async with st.session.post(st.url + "/v1/chat/completions", data=orjson.dumps(chat())) as resp:
        body = orjson.loads(await resp.read())
        assert resp.status == 429 and body["error"]["message"]
        assert RESULT_HEADER not in resp.headers
    assert st.inflight() == 0
