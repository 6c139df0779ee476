"""vllmhttp-parser: the reference's vllmhttp_test.go generate cases, and every other path parsed as
openai-parser parses it (the reference README's single-instance mode)."""

from __future__ import annotations

import orjson
import pytest

from epp.errors import BadRequest, MissingModel
from epp.framework.request import ApiKind, MultiModalFeature

from .parsers import parser

GEN = {":path": "/inference/v1/generate"}
FEATURES = {"mm_hashes": {"image": ["abc123hash", "def456hash"]},
            "mm_placeholders": {"image": [{"offset": 1, "length": 3}, {"offset": 4, "length": 3}]}}


@pytest.mark.parametrize("headers,body,expected", [
    (GEN, {"token_ids": [1, 2, 3]}, dict(token_ids=[1, 2, 3], cache_salt=None, stream=False, max_tokens=None)),
    (GEN, {"token_ids": [10, 20, 30], "cache_salt": "abc123"}, dict(token_ids=[10, 20, 30], cache_salt="abc123")),
    (GEN, {"token_ids": [1, 2, 3], "sampling_params": {"temperature": 0.8, "max_tokens": 128}, "stream": True},
     dict(token_ids=[1, 2, 3], stream=True, max_tokens=128)),
    ({"x-original-path": "/inference/v1/generate"}, {"token_ids": [5, 6, 7]}, dict(token_ids=[5, 6, 7])),
    (GEN, {"token_ids": [151644, 872, 198, 3838, 374, 279, 6722, 315, 9625, 30, 151645, 198, 151644, 77091, 198],
           "features": FEATURES}, dict(input_tokens=15)),
    (GEN, {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 128.0}}, dict(max_tokens=128)),
    (GEN, {"token_ids": [1, 2, 3], "sampling_params": {"temperature": 0.8}}, dict(max_tokens=None)),
    (GEN, {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": -1}}, dict(max_tokens=None)),
    (GEN, {"token_ids": [1.0, 2]}, dict(token_ids=[1, 2])),
], ids=["token-ids", "cache-salt", "sampling-params-and-stream", "x-original-path", "multimodal-features",
        "whole-float-limit", "no-limit", "negative-limit-ignored", "whole-float-ids"])
def test_generate_requests(headers: dict, body: dict, expected: dict) -> None:
    raw = orjson.dumps(body)
    r = parser("vllmhttp-parser").parse(headers.get(":path", ""), raw, headers)
    assert {k: getattr(r, k) for k in expected} == expected
    assert (r.api, r.body, r.body_size, r.model, r.model_rewritable) == (ApiKind.COMPLETIONS, body, len(raw), "", False)
    assert r.input_tokens == len(r.token_ids) and r.prompt_text == orjson.dumps(r.token_ids).decode()


def test_a_generate_body_that_names_its_model_has_it_rewritten() -> None:
    r = parser("vllmhttp-parser").parse("/inference/v1/generate", b'{"model":"m","token_ids":[1]}',
                                        {"x-llm-d-router-model-name-rewrite": "m-lora"})
    assert (r.model, r.target_model, r.model_rewritable) == ("m", "m-lora", True)


@pytest.mark.parametrize("body,message", [
    (b'{"token_ids":[1,2,-1]}', "token_ids[2]: invalid value"),
    (b'{"token_ids":[1,2.5]}', "token_ids[1]: invalid value"),
    (b'{"token_ids":[4294967296]}', "token_ids[0]: invalid value"),
    (b'{"token_ids":[]}', "must have non-empty token_ids field"),
    (b'{"sampling_params":{"temperature":0.8}}', "must have non-empty token_ids field"),
    (b'{"token_ids":"1 2"}', "'token_ids' must be an array of numbers"),
    (b'{"token_ids":[1,"2"]}', "'token_ids' must be an array of numbers"),
    (b'{"token_ids":[1],"cache_salt":7}', "'cache_salt' must be a string"),
    (b'{"token_ids":[],"cache_salt":7}', "'cache_salt' must be a string"),
    (b'{"token_ids":[1],"features":{"mm_hashes":{"image":[1]}}}', "malformed 'features'"),
    (b'{"token_ids":[1],"features":{"mm_placeholders":{"image":[{"offset":"1"}]}}}', "malformed 'features'"),
    (b"[1]", "the body must be a JSON object"),
    (b"{", "request body is not valid JSON"),
], ids=["negative", "fractional", "overflow", "empty", "missing", "not-an-array", "string-id", "salt-not-string",
        "decode-errors-before-emptiness", "bad-hashes", "bad-placeholders", "not-an-object", "not-json"])
def test_bad_generate_requests_are_400_with_the_reason(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as info:
        parser("vllmhttp-parser").parse("/inference/v1/generate", body, GEN)
    assert info.value.status == 400 and message in info.value.message


def test_other_paths_are_parsed_as_openai_parser_parses_them() -> None:
    p = parser("vllmhttp-parser")
    r = p.parse("/v1/completions", b'{"model":"m","prompt":"hello world"}', {})
    assert (r.api, r.prompt_text, r.model, r.model_rewritable) == (ApiKind.COMPLETIONS, "hello world", "m", True)
    with pytest.raises(MissingModel):
        p.parse("/v1/completions", b'{"prompt":"hello world"}', {})


def test_generate_features_become_the_requests_multimodal_items() -> None:
    body = {"token_ids": list(range(8)), "features": FEATURES}
    r = parser("vllmhttp-parser").parse("/inference/v1/generate", orjson.dumps(body), GEN)
    assert r.mm_features == (MultiModalFeature("image", "abc123hash", 1, 3),
                             MultiModalFeature("image", "def456hash", 4, 3))
    assert parser("vllmhttp-parser").parse("/inference/v1/generate", b'{"token_ids":[1]}', GEN).mm_features == ()
