"""``vllmgrpc-parser``: vLLM's gRPC engine API (``vllm.grpc.engine.VllmEngine``). The body is one gRPC-framed
protobuf message, chosen by the exact ``:path``:

* ``/vllm.grpc.engine.VllmEngine/Generate``: a ``GenerateRequest`` (``text`` or ``tokenized`` input; completions);
* ``/vllm.grpc.engine.VllmEngine/Embed``: an ``EmbedRequest`` (``tokenized`` input required; embeddings);
* any other path: not read; routed with nothing taken from the body.

The messages name no model: the model is the ``x-llm-d-router-model-name-rewrite`` header (else ""), and the body
is forwarded unchanged. A malformed payload is a ``BadRequest`` (400). :meth:`VllmGRPCParser.usage_reader` reads
the usage of the last response message that reports any.

YAML::

    plugins:
    - type: vllmgrpc-parser
    requestHandler:
      parsers:
      - pluginRef: vllmgrpc-parser   # the deprecated top-level parser: {pluginRef: vllmgrpc-parser} still works
"""

from __future__ import annotations

from typing import ClassVar, Mapping, TypeVar

from google.protobuf.message import DecodeError, Message

from epp._pb.engines import vllm_engine_pb2 as pb
from epp.errors import BadRequest, InvalidShape
from epp.framework.plugins import Handle, NoParams
from epp.framework.request import ApiKind, InferenceRequest
from epp.usage import NO_USAGE, Usage

from ._wire import GrpcFrames, grpc_payload, headers_request, skipped_request, text_prompt, token_prompt

__all__ = ["VllmGRPCParser", "VllmUsageReader", "GENERATE_PATH", "EMBED_PATH"]

GENERATE_PATH = "/vllm.grpc.engine.VllmEngine/Generate"
EMBED_PATH = "/vllm.grpc.engine.VllmEngine/Embed"


class VllmGRPCParser:
    """``parse(path, body, headers)``: a vLLM ``Generate`` or ``Embed`` gRPC request (see the module doc), or a
    ``BadRequest``; ``usage_reader`` reads the usage out of the gRPC responses."""

    type_name: ClassVar[str] = "vllmgrpc-parser"
    claims: ClassVar[tuple[str, ...]] = (GENERATE_PATH, EMBED_PATH)
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def parse(self, path: str, body: bytes, headers: dict[str, str]) -> InferenceRequest:
        try:
            payload = grpc_payload(body)
        except BadRequest:
            raise BadRequest("invalid or unsupported gRPC payload") from None
        if path == GENERATE_PATH:
            return _generate(_decode(pb.GenerateRequest, payload), headers, len(body))
        if path == EMBED_PATH:
            return _embed(_decode(pb.EmbedRequest, payload), headers, len(body))
        return skipped_request(body, headers)

    def usage_reader(self, request: InferenceRequest, sse: bool) -> VllmUsageReader:
        """A reader of the usage in this request's gRPC response: ``EmbedResponse`` for an embedding request,
        ``GenerateResponse`` messages otherwise (``sse`` does not matter: the framing is gRPC)."""
        return VllmUsageReader(embed=request.api is ApiKind.EMBEDDINGS)


_M = TypeVar("_M", bound=Message)


def _decode(message: type[_M], payload: bytes) -> _M:
    try:
        return message.FromString(payload)
    except DecodeError:
        raise BadRequest(f"unmarshaling {message.__name__}: not a valid protobuf {message.__name__}") from None


def _generate(req: pb.GenerateRequest, headers: Mapping[str, str], size: int) -> InferenceRequest:
    kind = req.WhichOneof("input")
    if kind == "text":
        prompt, tokens = text_prompt(req.text)
        ids = None
    elif kind == "tokenized":
        ids = list(req.tokenized.input_ids)
        prompt, tokens = token_prompt(ids)
    else:
        raise InvalidShape("not supported request inputType")
    sampling = req.sampling_params
    max_tokens = sampling.max_tokens if req.HasField("sampling_params") and sampling.HasField("max_tokens") else None
    return headers_request(headers, size, api=ApiKind.COMPLETIONS, prompt_text=prompt, input_tokens=tokens,
                           token_ids=ids, max_tokens=max_tokens, stream=req.stream, model_rewritable=False)


def _embed(req: pb.EmbedRequest, headers: Mapping[str, str], size: int) -> InferenceRequest:
    if not req.HasField("tokenized"):
        raise InvalidShape("missing tokenized input in EmbedRequest")
    ids = list(req.tokenized.input_ids)
    prompt, tokens = token_prompt(ids)
    return headers_request(headers, size, api=ApiKind.EMBEDDINGS, prompt_text=prompt, input_tokens=tokens,
                           token_ids=ids, model_rewritable=False)


class VllmUsageReader:
    """Usage from vLLM's gRPC responses, the last message reporting any: a ``GenerateResponse`` chunk or
    completion with a non-zero prompt or completion count gives ``(prompt, completion, cached)``; an
    ``EmbedResponse`` with a non-zero ``prompt_tokens`` gives ``(prompt, 0, None)``. Malformed messages are
    skipped."""

    __slots__ = ("_frames", "_embed", "_usage")

    def __init__(self, *, embed: bool = False) -> None:
        self._frames = GrpcFrames()
        self._embed = embed
        self._usage: Usage = NO_USAGE

    def feed(self, chunk: bytes) -> None:
        for message in self._frames.feed(chunk):
            try:
                usage = _embed_usage(message) if self._embed else _generate_usage(message)
            except DecodeError:
                continue
            if usage != NO_USAGE:
                self._usage = usage

    def usage(self) -> Usage:
        return self._usage


def _generate_usage(message: bytes) -> Usage:
    resp = pb.GenerateResponse.FromString(message)
    kind = resp.WhichOneof("response")
    if kind is None:
        return NO_USAGE
    part = resp.chunk if kind == "chunk" else resp.complete
    if part.prompt_tokens <= 0 and part.completion_tokens <= 0:
        return NO_USAGE
    return part.prompt_tokens, part.completion_tokens, part.cached_tokens


def _embed_usage(message: bytes) -> Usage:
    prompt = pb.EmbedResponse.FromString(message).prompt_tokens
    return (prompt, 0, None) if prompt > 0 else NO_USAGE
