"""Request fields as vLLM's request models read them (``bench.sim.protocol``): lax integers, defaults, and the
errors vLLM answers with."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from bench.sim import SimServer

CHAT = [{"role": "user", "content": "hi"}]


async def _post(server: SimServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(server.url + path, json=body) as resp:
            return resp.status, orjson.loads(await resp.read())


# ----------------------------------------------------------------------------- lax integers (pydantic)


@pytest.mark.parametrize(("value", "tokens"), [("5", 5), (" 7 ", 7), (2.0, 2), (True, 1), (3, 3)],
                         ids=["digits", "padded", "whole-float", "true", "int"])
@pytest.mark.parametrize(
    ("path", "key", "body"),
    [("/v1/completions", "max_tokens", {"prompt": "hi"}),
     ("/v1/chat/completions", "max_completion_tokens", {"messages": CHAT}),
     ("/v1/chat/completions", "max_tokens", {"messages": CHAT}),
     ("/v1/responses", "max_output_tokens", {"input": "hi"})],
    ids=["completions", "chat-max-completion-tokens", "chat-max-tokens", "responses"],
)
async def test_integer_fields_accept_what_pydantic_lax_mode_accepts(
    sim_server: SimServer, path: str, key: str, body: dict[str, Any], value: Any, tokens: int
) -> None:
    status, out = await _post(sim_server, path, {**body, key: value})
    assert status == 200, out
    used = out["usage"].get("completion_tokens", out["usage"].get("output_tokens"))
    assert used == tokens


@pytest.mark.parametrize(("value", "kind"), [(2.5, "int_from_float"), ("x", "int_parsing"), ("2.5", "int_parsing"),
                                             ([2], "int_type")], ids=["fraction", "word", "fraction-string", "list"])
async def test_integer_fields_refuse_what_pydantic_refuses(sim_server: SimServer, value: Any, kind: str) -> None:
    status, out = await _post(sim_server, "/v1/completions", {"prompt": "hi", "max_tokens": value})
    assert status == 400
    error = out["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert f"'type': '{kind}'" in error["message"] and "'loc': ('body', 'max_tokens')" in error["message"]


async def test_priority_and_n_are_lax_integers_too(sim_server: SimServer) -> None:
    body = {"prompt": "hi", "max_tokens": 2, "priority": "3", "n": "1"}
    assert (await _post(sim_server, "/v1/completions", body))[0] == 200
    status, out = await _post(sim_server, "/v1/completions", {**body, "priority": "high"})
    assert status == 400 and "('body', 'priority')" in out["error"]["message"]
