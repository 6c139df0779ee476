"""probabilistic-admitter through the ext_proc server (both transports): under a saturated pool a sheddable request
gets Envoy an ImmediateResponse with the reference's status and an OpenAI-style body; a critical one is routed."""

from __future__ import annotations

from pathlib import Path

import orjson

from .helpers import CHAT, make_director, request_body, request_headers, set_headers, specs

CONFIG = Path(__file__).parent.parent / "fixtures/configs/llmd/HEAD_probabilistic-admitter-readme-snippet.yaml"


async def test_sheddable_request_gets_an_immediate_500_critical_is_routed(serve) -> None:
    director = make_director(specs(2), CONFIG.read_text(), waiting={"ep0": 5, "ep1": 5})  # saturation 1.0
    director.datastore.objectives.set("batch-workload", -1)
    director.datastore.objectives.set("interactive-workload", 1)
    _, client = await serve(director)

    shed = {"x-gateway-inference-objective": "batch-workload"}
    replies = await client.exchange([request_headers(headers=shed), request_body(CHAT)], 1)
    answer = replies[0].immediate_response
    assert answer.status.code == 500
    error = orjson.loads(answer.body)["error"]
    assert error == {"message": "request cannot be admitted: probabilistic-admitter: rejected, saturation=1.000 "
                                "prob=1.00", "type": "server_error", "param": None, "code": "Internal"}

    critical = {"x-gateway-inference-objective": "interactive-workload"}
    replies = await client.exchange([request_headers(headers=critical), request_body(CHAT)], 1)
    assert replies[0].WhichOneof("response") == "request_headers"
    target = set_headers(replies[0].request_headers.response)["x-gateway-destination-endpoint"]
    assert target in {"10.0.0.1:8000", "10.0.0.2:8000"}
