"""Places where the simulator once answered differently from vLLM, one section each."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp_sim import SimConfig, SimPool, SimServer
from epp_sim.cli import build_configs, parse_args
from epp_sim.config import NATIVE_MAX_MODEL_LEN

StartServer = Callable[..., Awaitable[SimServer]]
FAST = 0.002


async def _post(server: SimServer, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    """(status, content type, raw body) of one POST."""
    async with aiohttp.ClientSession() as session:
        async with session.post(server.url + path, json=body) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), await resp.read()


async def _families(server: SimServer) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/metrics") as resp:
            text = await resp.text()
    return {f.name: f for f in text_string_to_metric_families(text)}


# ----------------------------------------------------------------------------- max_model_len and the KV cache


def test_max_model_len_the_kv_cache_cannot_hold_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match=r"max seq len \(32768\) is larger than the maximum number of tokens "
                                         r"that can be stored in KV cache \(1024"):
        SimConfig(num_gpu_blocks=64, max_model_len=32768)
    with pytest.raises(ValueError, match="at least 2"):
        SimConfig(max_model_len=1)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, NATIVE_MAX_MODEL_LEN),  # 2048 blocks of 16 hold exactly the model's context
        ({"num_gpu_blocks": 64}, 1024),
        ({"num_gpu_blocks": 64, "max_model_len": -1}, 1024),
        ({"num_gpu_blocks": 100_000}, NATIVE_MAX_MODEL_LEN),
        ({"num_gpu_blocks": 64, "max_model_len": 1024}, 1024),
        ({"num_gpu_blocks": 64, "max_model_len": 500}, 500),
    ],
    ids=["default", "small-cache", "explicit-auto", "large-cache", "exact-fit", "explicit-smaller"],
)
def test_unset_max_model_len_fits_the_kv_cache(fields: dict[str, Any], expected: int) -> None:
    assert SimConfig(**fields).max_model_len == expected


def test_cli_refuses_a_max_model_len_beyond_the_kv_cache() -> None:
    # `epp-sim` prints a ValueError from build_configs and exits with status 2 before serving.
    args = parse_args(["--num-gpu-blocks", "64", "--max-model-len", "32768"])
    with pytest.raises(ValueError, match="can be stored in KV cache"):
        build_configs(args)
    [cfg], _ = build_configs(parse_args(["--num-gpu-blocks", "64"]))
    assert cfg.max_model_len == 1024


async def test_small_kv_cache_advertises_and_enforces_its_length(start_server: StartServer) -> None:
    server = await start_server(num_gpu_blocks=64)
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/v1/models") as resp:
            [card] = (await resp.json())["data"]
    assert card["max_model_len"] == 1024
    status, _, raw = await _post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2000})
    assert status == 400
    error = orjson.loads(raw)["error"]
    assert error["message"] == ("max_tokens=2000cannot be greater than max_model_len=max_total_tokens=1024. Please "
                                "request fewer output tokens. (parameter=max_tokens, value=2000)")
    assert error["param"] == "max_tokens"


# ----------------------------------------------------------------------------- iteration_tokens_total buckets


@pytest.mark.parametrize("budget", [512, 8192, 65536])
async def test_iteration_tokens_buckets_are_vllms_fixed_list(start_server: StartServer, budget: int) -> None:
    server = await start_server(max_num_batched_tokens=budget)
    family = (await _families(server))["vllm:iteration_tokens_total"]
    bounds = [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]
    vllm = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    assert bounds == [str(float(b)) for b in vllm] + ["+Inf"]


# ----------------------------------------------------------------------------- lax booleans (pydantic)

STREAM_VALUES = [
    ("false", False), ("FALSE", False), ("0", False), ("no", False), ("off", False), (0, False), (False, False),
    (None, False), ("true", True), ("True", True), ("1", True), ("yes", True), ("ON", True), (1, True), (True, True),
]


@pytest.mark.parametrize(("value", "streams"), STREAM_VALUES, ids=[repr(v) for v, _ in STREAM_VALUES])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
    ],
    ids=["completions", "chat", "responses"],
)
async def test_stream_is_parsed_as_pydantic_parses_a_bool(
    sim_server: SimServer, path: str, body: dict[str, Any], value: Any, streams: bool
) -> None:
    status, content_type, _ = await _post(sim_server, path, {**body, "stream": value})
    assert status == 200
    assert content_type.startswith("text/event-stream" if streams else "application/json")


@pytest.mark.parametrize("value", ["maybe", "", 2, 0.5, [], {}], ids=repr)
async def test_a_stream_value_pydantic_rejects_is_a_400(sim_server: SimServer, value: Any) -> None:
    status, _, raw = await _post(sim_server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": value})
    assert status == 400
    error = orjson.loads(raw)["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert "'loc': ('body', 'stream')" in error["message"] and "valid boolean" in error["message"]


@pytest.mark.parametrize(
    ("options", "has_usage"),
    [({"include_usage": "false"}, False), ({"include_usage": "0"}, False), ({"include_usage": None}, False),
     ({"include_usage": "yes"}, True), ({"include_usage": 1}, True), ({}, True)],
    ids=["false", "0", "null", "yes", "1", "default"],
)
async def test_include_usage_is_parsed_the_same_way(
    sim_server: SimServer, options: dict[str, Any], has_usage: bool
) -> None:
    body = {"prompt": "hi", "max_tokens": 2, "stream": "true", "stream_options": options}
    status, _, raw = await _post(sim_server, "/v1/completions", body)
    assert status == 200
    assert (b'"usage":{' in raw) == has_usage


async def test_include_usage_vllm_cannot_parse_is_a_400(sim_server: SimServer) -> None:
    body = {"prompt": "hi", "max_tokens": 2, "stream": True, "stream_options": {"include_usage": "maybe"}}
    status, _, raw = await _post(sim_server, "/v1/completions", body)
    assert status == 400
    assert "('body', 'stream_options', 'include_usage')" in orjson.loads(raw)["error"]["message"]


async def test_stream_options_check_reads_the_raw_stream_value_as_vllm_does(sim_server: SimServer) -> None:
    # vLLM's before-validator sees the string "false" as set, so this is not refused; the request does not stream.
    body = {"prompt": "hi", "max_tokens": 2, "stream": "false", "stream_options": {"include_usage": True}}
    status, content_type, _ = await _post(sim_server, "/v1/completions", body)
    assert (status, content_type.split(";")[0]) == (200, "application/json")
    body = {"prompt": "hi", "max_tokens": 2, "stream": False, "stream_options": {"include_usage": True}}
    assert (await _post(sim_server, "/v1/completions", body))[0] == 400


def _sse_chunks(raw: bytes) -> list[dict[str, Any]]:
    """The JSON chunks of an SSE body, without the closing ``[DONE]``."""
    lines = [line.removeprefix(b"data: ") for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    return [orjson.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/completions", {"prompt": "hello " * 20}),
     ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello " * 20}]})],
    ids=["completions", "chat"],
)
async def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(
    sim_server: SimServer, path: str, body: dict[str, Any]
) -> None:
    # vLLM (serving.py of chat and completions): with include_usage and continuous_usage_stats, every chunk
    # carries {prompt_tokens, total_tokens, completion_tokens} counted so far, then the final usage chunk follows.
    options = {"include_usage": True, "continuous_usage_stats": "true"}
    status, _, raw = await _post(sim_server, path, {**body, "max_tokens": 5, "stream": True, "stream_options": options})
    assert status == 200
    *chunks, final = _sse_chunks(raw)
    prompt = final["usage"]["prompt_tokens"]
    generated = 0
    for chunk in chunks:
        choice = chunk["choices"][0]
        generated += bool(choice.get("text") or choice.get("delta", {}).get("content"))
        assert chunk["usage"] == {"prompt_tokens": prompt, "total_tokens": prompt + generated,
                                  "completion_tokens": generated}
    assert generated == 5 and final["choices"] == [] and final["usage"]["completion_tokens"] == 5
    assert "prompt_tokens_details" in final["usage"]


@pytest.mark.parametrize(
    "options", [{"continuous_usage_stats": True, "include_usage": False}, {"continuous_usage_stats": False}],
    ids=["without-include-usage", "off"],
)
async def test_continuous_usage_stats_need_include_usage(sim_server: SimServer, options: dict[str, Any]) -> None:
    body = {"prompt": "hi", "max_tokens": 3, "stream": True, "stream_options": options}
    status, _, raw = await _post(sim_server, "/v1/completions", body)
    assert status == 200
    chunks = _sse_chunks(raw)
    assert all("usage" not in chunk for chunk in chunks if chunk["choices"])
    assert ("usage" in chunks[-1]) == options.get("include_usage", True)


# ----------------------------------------------------------------------------- LoRA info only with LoRA enabled


@pytest.mark.parametrize(
    ("fields", "max_lora"),
    [({}, None), ({"enable_lora": False}, None), ({"enable_lora": True}, "4"), ({"lora_adapters": ["a"]}, "4"),
     ({"v0_metrics": True}, "0"), ({"v0_metrics": True, "enable_lora": True, "max_loras": 2}, "2")],
    ids=["default", "disabled", "enabled", "adapters-imply-it", "v0-without-lora", "v0-with-lora"],
)
async def test_lora_info_is_exported_only_with_lora_enabled(
    start_server: StartServer, fields: dict[str, Any], max_lora: str | None
) -> None:
    families = await _families(await start_server(**fields))
    if max_lora is None:
        assert "vllm:lora_requests_info" not in families
        return
    [sample] = families["vllm:lora_requests_info"].samples
    assert sample.labels == {"max_lora": max_lora, "running_lora_adapters": "", "waiting_lora_adapters": ""}


def test_preloaded_adapters_need_lora_enabled() -> None:
    assert SimConfig().enable_lora is False
    assert SimConfig(lora_adapters=["a"]).enable_lora is True
    with pytest.raises(ValueError, match="enable_lora"):
        SimConfig(enable_lora=False, lora_adapters=["a"])
    [cfg], _ = build_configs(parse_args(["--enable-lora"]))
    assert cfg.enable_lora is True


async def test_loading_an_adapter_needs_lora_enabled(start_server: StartServer) -> None:
    body = {"lora_name": "chat", "lora_path": "/adapters/chat"}
    assert (await _post(await start_server(), "/v1/load_lora_adapter", body))[0] == 400
    assert (await _post(await start_server(enable_lora=True), "/v1/load_lora_adapter", body))[0] == 200


# ----------------------------------------------------------------------------- a KV pull that cannot happen

PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _decode_params(**overrides: Any) -> dict[str, Any]:
    params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1, 2, 3],
              "remote_engine_id": "nope", "remote_request_id": "r-0", "remote_host": "127.0.0.1",
              "remote_port": _closed_port(), "tp_size": 1}
    return {**params, **overrides}


async def _complete(server: SimServer, body: dict[str, Any]) -> dict[str, Any]:
    status, _, raw = await _post(server, "/v1/completions", body)
    assert status == 200, raw
    return dict(orjson.loads(raw))


@pytest.mark.parametrize(
    "overrides",
    [{}, {"remote_host": None, "remote_port": None}, {"remote_engine_id": None}, {"remote_host": "DUMMY"}],
    ids=["unreachable", "no-address", "no-engine-id", "bad-host"],
)
async def test_a_pull_from_a_missing_prefiller_recomputes_the_prompt(
    start_server: StartServer, overrides: dict[str, Any]
) -> None:
    decode = await start_server(role="decode")
    body = {"prompt": "word " * 80, "max_tokens": 3, "kv_transfer_params": _decode_params(**overrides)}
    out = await _complete(decode, body)
    n = out["usage"]["prompt_tokens"]
    assert out["usage"]["completion_tokens"] == 3
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # nothing came from the transfer
    stats = decode.engine.stats
    assert stats.iteration_tokens.sum == n + 2  # the whole prompt was prefilled here
    assert stats.kv_load_failures == 1 and not decode.pull_sources


async def test_a_failed_pull_still_uses_the_local_prefix_cache(start_server: StartServer) -> None:
    decode = await start_server(role="decode")
    prompt = "word " * 80
    await _complete(decode, {"prompt": prompt, "max_tokens": 1})
    out = await _complete(decode, {"prompt": prompt, "max_tokens": 3, "kv_transfer_params": _decode_params()})
    n = out["usage"]["prompt_tokens"]
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16 < n - 1


async def test_a_prefiller_answering_under_another_engine_id_is_not_pulled_from() -> None:
    configs = [SimConfig(role=role, time_scale=FAST) for role in ("prefill", "decode")]
    async with SimPool(configs) as pool:
        prefill, decode = pool.servers
        prompt = "x" * 400
        p = await _complete(prefill, {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS})
        params = {**p["kv_transfer_params"], "remote_engine_id": "elsewhere"}
        d = await _complete(decode, {"prompt": prompt, "max_tokens": 4, "kv_transfer_params": params})
        assert d["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert decode.engine.stats.kv_load_failures == 1
        assert prefill.engine.held  # nobody pulled: the blocks wait for the hold timeout
