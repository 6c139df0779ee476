"""Request fields as vLLM's request models read them (``epp_sim.protocol``): lax integers, defaults, and the
errors vLLM answers with."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from epp_sim import SimServer

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


# ----------------------------------------------------------------------------- output length defaults


@pytest.mark.parametrize("extra", [{}, {"max_tokens": None}], ids=["absent", "null"])
async def test_a_completion_without_max_tokens_generates_vllms_default_16(
    sim_server: SimServer, extra: dict[str, Any]
) -> None:
    # vLLM's CompletionRequest: max_tokens: int | None = 16, and normalize_null_max_tokens maps null to it.
    status, out = await _post(sim_server, "/v1/completions", {"prompt": "hi", **extra})
    assert status == 200
    assert out["usage"]["completion_tokens"] == 16 and out["choices"][0]["finish_reason"] == "length"


async def test_a_chat_without_max_tokens_may_run_to_the_context_length(start_server: Any) -> None:
    # vLLM's ChatCompletionRequest has no default: the limit is max_model_len minus the prompt.
    server = await start_server(output_len_mean=100_000, max_model_len=256)
    status, out = await _post(server, "/v1/chat/completions", {"messages": CHAT})
    assert status == 200
    assert out["usage"]["total_tokens"] == 256 and out["choices"][0]["finish_reason"] == "length"


# ----------------------------------------------------------------------------- context-length errors

LENGTH_CASES = [
    ("/v1/completions", {"prompt": "x" * 1000},
     "You passed 250 input tokens and requested 16 output tokens. However, the model's context length is only "
     "256 tokens, resulting in a maximum input length of 240 tokens. Please reduce the length of the input prompt. "
     "(parameter=input_tokens, value=250)", "input_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 968}], "max_completion_tokens": 10},
     "However, the model's context length is only 256 tokens, resulting in a maximum input length of 246 "
     "tokens.", "input_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 300},
     "max_tokens=300cannot be greater than max_model_len=max_total_tokens=256. Please request fewer output tokens. "
     "(parameter=max_tokens, value=300)", "max_tokens"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 257},
     "max_output_tokens=257cannot be greater than max_model_len=max_total_tokens=256.", "max_output_tokens"),
    ("/v1/completions", {"prompt": [7] * 256, "max_tokens": None}, "You passed 256 input tokens",
     "input_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 1000}]},
     "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens"),
]


@pytest.mark.parametrize(("path", "body", "message", "param"), LENGTH_CASES,
                         ids=["prompt-plus-default", "chat-prompt", "output-beyond-context", "responses-output",
                              "token-ids", "chat-prompt-fills-the-context"])
async def test_context_length_errors_use_vllms_messages(
    start_server: Any, path: str, body: dict[str, Any], message: str, param: str
) -> None:
    # vllm/renderers/params.py (TokenizeParams) and sampling_params.py, through str(VLLMValidationError): 400,
    # BadRequestError, param = the VLLMValidationError's parameter.
    server = await start_server(max_model_len=256)
    status, out = await _post(server, path, body)
    assert status == 400
    error = out["error"]
    assert message in error["message"]
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", param, 400)


@pytest.mark.parametrize("value", [0, -1, "0"], ids=repr)
async def test_an_output_limit_below_one_is_vllms_sampling_params_error(sim_server: SimServer, value: Any) -> None:
    status, out = await _post(sim_server, "/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": value})
    assert status == 400
    got = int(value)
    assert out["error"]["message"] == f"max_tokens must be at least 1, got {got}. (parameter=max_tokens, value={got})"
    assert out["error"]["param"] == "max_tokens"


async def test_a_chat_streams_role_chunk_comes_with_the_first_token(sim_server: SimServer) -> None:
    """vLLM yields a chat stream's role chunk on the engine's first output, so it arrives with the first token
    (after prefill), never before: a gateway timing the first body byte sees the real time to first token."""
    body = {"model": sim_server.cfg.model, "messages": CHAT, "max_tokens": 3, "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(sim_server.url + "/v1/chat/completions", json=body) as resp:
            first = await resp.content.readany()
            rest = await resp.read()
    events = [orjson.loads(line[6:]) for line in first.split(b"\n\n") if line.startswith(b"data: {")]
    assert [e["choices"][0]["delta"].get("role") for e in events][:1] == ["assistant"]
    assert len(events) >= 2 and events[1]["choices"][0]["delta"]["content"]  # the first token, same write
    assert (first + rest).count(b'"role":"assistant"') == 1 and (first + rest).endswith(b"data: [DONE]\n\n")

