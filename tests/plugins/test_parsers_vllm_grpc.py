"""vllmgrpc-parser: the reference's vllmgrpc_test.go cases (requests, output limits, responses) translated to
EPP's InferenceRequest and usage triples."""

from __future__ import annotations

import pytest

from epp._pb.engines import vllm_engine_pb2 as pb
from epp.errors import BadRequest
from epp.framework.request import ApiKind
from epp.plugins.parsers.vllm_grpc import EMBED_PATH, GENERATE_PATH
from epp.usage import NO_USAGE

from .parsers import frame, parser

TOKENIZED = pb.TokenizedInput(original_text="Tokenized hello", input_ids=[11, 12, 13])


@pytest.mark.parametrize("path,message,expected", [
    (GENERATE_PATH, pb.GenerateRequest(text="Hello world"),
     dict(api=ApiKind.COMPLETIONS, prompt_text="Hello world", input_tokens=2, token_ids=None, stream=False)),
    (GENERATE_PATH, pb.GenerateRequest(tokenized=TOKENIZED),
     dict(api=ApiKind.COMPLETIONS, prompt_text="[11,12,13]", input_tokens=3, token_ids=[11, 12, 13])),
    (GENERATE_PATH, pb.GenerateRequest(
        tokenized=pb.TokenizedInput(original_text="Describe image", input_ids=[101, 102, 103, 104, 105]),
        mm_inputs=pb.MultimodalInputs(mm_placeholders=[pb.PlaceholderRange(offset=1, length=2)],
                                      mm_hashes=["hash-a"])),
     dict(token_ids=[101, 102, 103, 104, 105], input_tokens=5)),
    (GENERATE_PATH, pb.GenerateRequest(text="Hello world", stream=True), dict(stream=True, prompt_text="Hello world")),
    (EMBED_PATH, pb.EmbedRequest(tokenized=pb.TokenizedInput(original_text="Embed this", input_ids=[4, 5, 6])),
     dict(api=ApiKind.EMBEDDINGS, token_ids=[4, 5, 6], prompt_text="[4,5,6]", input_tokens=3)),
], ids=["text", "tokenized", "tokenized-multimodal", "stream", "embed"])
def test_requests_are_read_from_the_proto(path: str, message: object, expected: dict) -> None:
    body = frame(message)
    r = parser("vllmgrpc-parser").parse(path, body, {"x-llm-d-router-model-name-rewrite": "llama"})
    assert {k: getattr(r, k) for k in expected} == expected
    assert (r.model, r.target_model, r.model_rewritable, r.body_size) == ("llama", "llama", False, len(body))


def test_an_unsupported_path_is_routed_without_reading_the_message() -> None:
    r = parser("vllmgrpc-parser").parse("/unsupported/path", frame(pb.GenerateRequest(text="hello")), {})
    assert (r.prompt_text, r.model, r.model_rewritable, r.token_ids) == ("", "", False, None)


@pytest.mark.parametrize("sampling,expected", [
    (pb.SamplingParams(max_tokens=256), 256),
    (None, None),
    (pb.SamplingParams(), None),
    (pb.SamplingParams(max_tokens=0), 0),
], ids=["max-tokens", "no-sampling-params", "sampling-params-without-max-tokens", "explicit-zero-binds"])
def test_the_output_limit_is_sampling_params_max_tokens(sampling: object, expected: int | None) -> None:
    for message in (pb.GenerateRequest(text="hello"), pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[1]))):
        if sampling is not None:
            message.sampling_params.CopyFrom(sampling)
        assert parser("vllmgrpc-parser").parse(GENERATE_PATH, frame(message), {}).max_tokens == expected


@pytest.mark.parametrize("path,body,message", [
    (GENERATE_PATH, bytes([0, 0, 0]), "invalid or unsupported gRPC payload"),
    (GENERATE_PATH, bytes([1, 0, 0, 0, 0]), "invalid or unsupported gRPC payload"),
    ("/unsupported/path", bytes([0, 0, 0]), "invalid or unsupported gRPC payload"),
    (GENERATE_PATH, frame(pb.GenerateRequest()), "not supported request inputType"),
    (GENERATE_PATH, frame(b"\xff"), "unmarshaling GenerateRequest"),
    (EMBED_PATH, frame(pb.EmbedRequest()), "missing tokenized input in EmbedRequest"),
    (EMBED_PATH, frame(b"\xff"), "unmarshaling EmbedRequest"),
], ids=["too-short", "compressed", "too-short-any-path", "nil-input", "bad-generate-proto", "embed-not-tokenized",
        "bad-embed-proto"])
def test_bad_requests_are_400(path: str, body: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as info:
        parser("vllmgrpc-parser").parse(path, body, {})
    assert info.value.status == 400 and message in info.value.message


def chunk(**kw: object) -> bytes:
    return frame(pb.GenerateResponse(chunk=pb.GenerateStreamChunk(**kw)))


def complete(**kw: object) -> bytes:
    return frame(pb.GenerateResponse(complete=pb.GenerateComplete(**kw)))


@pytest.mark.parametrize("api,chunks,usage", [
    (ApiKind.COMPLETIONS, [chunk(token_ids=[1, 2, 3], prompt_tokens=10, completion_tokens=5, cached_tokens=2)],
     (10, 5, 2)),
    (ApiKind.COMPLETIONS, [complete(finish_reason="stop", prompt_tokens=20, completion_tokens=15, cached_tokens=5)],
     (20, 15, 5)),
    (ApiKind.COMPLETIONS, [chunk(token_ids=[4])], NO_USAGE),
    (ApiKind.COMPLETIONS, [frame(pb.GenerateResponse())], NO_USAGE),
    (ApiKind.EMBEDDINGS, [frame(pb.EmbedResponse(prompt_tokens=10, embedding=[1.0, 2.0], embedding_dim=2))],
     (10, 0, None)),
    (ApiKind.COMPLETIONS, [complete(prompt_tokens=20, completion_tokens=15)], (20, 15, 0)),
    (ApiKind.COMPLETIONS, [chunk(token_ids=[1]), chunk(token_ids=[2]),
                           complete(finish_reason="length", prompt_tokens=7, completion_tokens=2)], (7, 2, 0)),
    (ApiKind.COMPLETIONS, [frame(b"\xff"), complete(prompt_tokens=1, completion_tokens=1)], (1, 1, 0)),
], ids=["chunk", "complete", "intermediate-chunk-without-counts", "no-response", "embed", "complete-without-cached",
        "stream-ends-with-complete", "malformed-message-skipped"])
def test_usage_is_read_from_the_responses(api: ApiKind, chunks: list[bytes], usage: tuple) -> None:
    request = parser("vllmgrpc-parser").parse(
        EMBED_PATH if api is ApiKind.EMBEDDINGS else GENERATE_PATH,
        frame(pb.EmbedRequest(tokenized=pb.TokenizedInput(input_ids=[1])) if api is ApiKind.EMBEDDINGS
              else pb.GenerateRequest(text="x")), {})
    reader = parser("vllmgrpc-parser").usage_reader(request, False)
    stream = b"".join(chunks)
    for i in range(0, len(stream), 4):  # arbitrary chunking
        reader.feed(stream[i:i + 4])
    assert reader.usage() == usage
