"""sglanghttp-parser: the reference's sglanghttp_test.go cases (/generate requests, errors, meta_info usage)."""

from __future__ import annotations

import orjson
import pytest

from epp.errors import BadRequest
from epp.framework.request import ApiKind
from epp.usage import NO_USAGE

from .parsers import parser

GEN = {":path": "/generate"}


@pytest.mark.parametrize("headers,body,expected", [
    (GEN, {"input_ids": [1, 2, 3]}, dict(token_ids=[1, 2, 3], cache_salt=None, max_tokens=None, stream=False)),
    (GEN, {"input_ids": [10, 20], "extra_key": "salt-abc"}, dict(token_ids=[10, 20], cache_salt="salt-abc")),
    (GEN, {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 256}}, dict(max_tokens=256)),
    (GEN, {"input_ids": [1, 2, 3], "stream": True}, dict(stream=True)),
    (GEN, {"text": "ignored by the parser", "input_ids": [7, 8]}, dict(token_ids=[7, 8], prompt_text="[7,8]")),
    ({"x-original-path": "/generate"}, {"input_ids": [5, 6, 7]}, dict(token_ids=[5, 6, 7])),
    ({":path": "/generate/?x=1"}, {"input_ids": [5]}, dict(token_ids=[5], input_tokens=1)),
    (GEN, {"input_ids": [1], "sampling_params": [{"max_new_tokens": 5}]}, dict(max_tokens=None)),
    (GEN, {"input_ids": [1], "sampling_params": {"max_new_tokens": 5.0}}, dict(max_tokens=None)),
], ids=["input-ids", "extra-key-is-cache-salt", "max-new-tokens", "stream", "unrelated-fields-left-to-sglang",
        "x-original-path", "trailing-slash-and-query", "batched-sampling-params-no-limit", "float-limit-ignored"])
def test_generate_requests(headers: dict, body: dict, expected: dict) -> None:
    raw = orjson.dumps(body)
    r = parser("sglanghttp-parser").parse(headers.get(":path", ""), raw, headers)
    assert {k: getattr(r, k) for k in expected} == expected
    assert (r.api, r.model_rewritable, r.body, r.body_size) == (ApiKind.COMPLETIONS, False, body, len(raw))
    assert r.input_tokens == len(r.token_ids) and r.prompt_text == orjson.dumps(r.token_ids).decode()


@pytest.mark.parametrize("path,body,message", [
    ("/generate", b'{"input_ids":[1,2,-1]}', "input_ids must be an array of uint32 integers"),
    ("/generate", b'{"input_ids":[1,2.5]}', "input_ids must be an array of uint32 integers"),
    ("/generate", b'{"input_ids":[4294967296]}', "input_ids must be an array of uint32 integers"),
    ("/generate", b'{"input_ids":[]}', "input_ids cannot be empty"),
    ("/generate", b'{"input_embeds":[[0.1,0.2]]}', "input_ids must be provided"),
    ("/generate", b'{"text":"hello"}', "input_ids must be provided"),
    ("/generate", b'{"sampling_params":{"temperature":0.8}}', "input_ids must be provided"),
    ("/generate", b'{"input_ids":[[1,2],[3,4]]}', "input_ids must be an array of uint32 integers"),
    ("/generate", b'{"input_ids":[1,2],"extra_key":["a","b"]}', "extra_key must be a string"),
    ("/generate", b'{"input_ids":[1],"stream":"yes"}', "'stream' must be a boolean"),
    ("/generate", b"[1,2]", "the body must be a JSON object"),
    ("/generate", b"{", "invalid generate request"),
    ("/v1/completions", b'{"input_ids":[1]}', "unsupported path"),
    ("/regenerate", b'{"input_ids":[1]}', "unsupported path"),
    ("/health_generate", b'{"input_ids":[1]}', "unsupported path"),
    ("/vertex_generate", b'{"input_ids":[1]}', "unsupported path"),
    ("/inference/v1/generate", b'{"input_ids":[1]}', "unsupported path"),
    ("/prefix/generate", b'{"input_ids":[1]}', "unsupported path"),
], ids=["negative", "fractional", "overflow", "empty", "input-embeds-only", "text-only", "missing", "batched",
        "per-prompt-extra-key", "stream-not-bool", "not-an-object", "not-json", "completions-path", "regenerate",
        "health-generate", "vertex-generate", "vllm-generate", "prefixed-generate"])
def test_bad_requests_are_400_with_the_reason(path: str, body: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as info:
        parser("sglanghttp-parser").parse(path, body, {":path": path})
    assert info.value.status == 400 and message in info.value.message


@pytest.mark.parametrize("sse,body,usage", [
    (False, b'{"text":"hello","meta_info":{"prompt_tokens":10,"completion_tokens":5}}', (10, 5, None)),
    (False, b'{"text":"hi","output_ids":[1,2],"meta_info":{"id":"req-1","prompt_tokens":8,"completion_tokens":3,'
            b'"cached_tokens":2}}', (8, 3, 2)),
    (True, b'data: {"text":"he","meta_info":{"prompt_tokens":10,"completion_tokens":2}}\n\n'
           b'data: {"text":"hello","meta_info":{"prompt_tokens":10,"completion_tokens":5,'
           b'"finish_reason":{"type":"stop"}}}\n\ndata: [DONE]\n\n', (10, 5, None)),
    (True, b'data: {"text":"he","meta_info":{"prompt_tokens":10,"completion_tokens":2}}\n\n', NO_USAGE),
    (True, b'event: generation\ndata: {"text":"hello","meta_info":{"prompt_tokens":10,"completion_tokens":5,'
           b'"finish_reason":{"type":"stop"}}}\n\n', (10, 5, None)),
    (True, b"data: [DONE]\n\n", NO_USAGE),
    (False, b"", NO_USAGE),
    (False, b'{"text":"","meta_info":{"prompt_tokens":0,"completion_tokens":0}}', (0, 0, None)),
    (False, b'{"meta_info":', NO_USAGE),
    (False, b'{"meta_info":{"prompt_tokens":1.5,"completion_tokens":2}}', NO_USAGE),
], ids=["json", "json-with-cached", "stream-final-chunk-only", "stream-without-final-chunk",
        "stream-with-event-lines", "done-only", "empty", "explicit-zero-kept", "invalid-json", "non-integer-count"])
def test_usage_is_read_from_meta_info(sse: bool, body: bytes, usage: tuple) -> None:
    reader = parser("sglanghttp-parser").usage_reader(None, sse)
    for i in range(0, len(body), 7):  # arbitrary chunking
        reader.feed(body[i:i + 7])
    assert reader.usage() == usage
