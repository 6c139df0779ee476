"""``sglanggrpc-parser``: SGLang's gRPC runtime API (``sglang.runtime.v1.SglangService``).

``/sglang.runtime.v1.SglangService/TextGenerate`` (exact ``:path``): the body is one gRPC-framed
``TextGenerateRequest`` whose ``text`` is the prompt, ``stream`` the stream flag and
``sampling_params.max_new_tokens`` the output limit; the API is completions. Any other path is not read (routed with
nothing taken from the body). The message names no model: the model is the ``x-llm-d-router-model-name-rewrite``
header (else ""), and the body is forwarded unchanged. :meth:`SglangGRPCParser.usage_reader` reads the counts from
the responses' ``meta_info``.

YAML::

    plugins:
    - type: sglanggrpc-parser
    requestHandler:
      parsers:
      - pluginRef: sglanggrpc-parser   # the deprecated top-level parser: {pluginRef: sglanggrpc-parser} still works
"""

from __future__ import annotations

import re
from typing import ClassVar, Mapping

from google.protobuf.message import DecodeError

from epp._pb.engines import sglang_pb2 as pb
from epp.errors import BadRequest
from epp.framework.plugins import Handle, NoParams
from epp.framework.request import ApiKind, InferenceRequest
from epp.usage import NO_USAGE, Usage

from ._wire import GrpcFrames, grpc_payload, headers_request, skipped_request, text_prompt

__all__ = ["SglangGRPCParser", "SglangGrpcUsageReader", "TEXT_GENERATE_PATH"]

TEXT_GENERATE_PATH = "/sglang.runtime.v1.SglangService/TextGenerate"
_LEADING_INT = re.compile(r"\s*([+-]?\d+)")


class SglangGRPCParser:
    """``parse(path, body, headers)``: an SGLang ``TextGenerate`` gRPC request (see the module doc), or a
    ``BadRequest``; ``usage_reader`` reads the usage out of the gRPC responses' ``meta_info``."""

    type_name: ClassVar[str] = "sglanggrpc-parser"
    claims: ClassVar[tuple[str, ...]] = (TEXT_GENERATE_PATH,)
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def parse(self, path: str, body: bytes, headers: dict[str, str]) -> InferenceRequest:
        if path != TEXT_GENERATE_PATH:
            return skipped_request(body, headers)
        try:
            req = pb.TextGenerateRequest.FromString(grpc_payload(body))
        except BadRequest as exc:
            raise BadRequest(f"parsing gRPC payload for TextGenerate: {exc.message}") from None
        except DecodeError:
            raise BadRequest("parsing gRPC payload for TextGenerate: not a valid protobuf TextGenerateRequest"
                             ) from None
        return _text_generate(req, headers, len(body))

    def usage_reader(self, request: InferenceRequest, sse: bool) -> SglangGrpcUsageReader:
        """A reader of the usage in this request's gRPC response (``sse`` does not matter: the framing is gRPC)."""
        return SglangGrpcUsageReader()


def _text_generate(req: pb.TextGenerateRequest, headers: Mapping[str, str], size: int) -> InferenceRequest:
    prompt, tokens = text_prompt(req.text)
    sampling = req.sampling_params
    limit = sampling.max_new_tokens if req.HasField("sampling_params") and sampling.HasField("max_new_tokens") \
        else None
    return headers_request(headers, size, api=ApiKind.COMPLETIONS, prompt_text=prompt, input_tokens=tokens,
                           max_tokens=limit if limit is not None and limit >= 0 else None, stream=req.stream,
                           model_rewritable=False)


class SglangGrpcUsageReader:
    """Usage from SGLang's gRPC ``TextGenerateResponse`` messages: the last one whose ``meta_info`` has a
    readable ``prompt_tokens`` or ``completion_tokens`` gives ``(prompt, completion, None)``, a missing count
    being 0 as in the reference. Malformed messages are skipped."""

    __slots__ = ("_frames", "_usage")

    def __init__(self) -> None:
        self._frames = GrpcFrames()
        self._usage: Usage = NO_USAGE

    def feed(self, chunk: bytes) -> None:
        for message in self._frames.feed(chunk):
            try:
                meta = pb.TextGenerateResponse.FromString(message).meta_info
            except DecodeError:
                continue
            prompt, completion = _count(meta.get("prompt_tokens")), _count(meta.get("completion_tokens"))
            if prompt is not None or completion is not None:
                self._usage = (prompt or 0, completion or 0, None)

    def usage(self) -> Usage:
        return self._usage


def _count(text: str | None) -> int | None:
    """The decimal integer at the start of ``text`` (leading spaces skipped), as Go's ``Sscanf("%d")``."""
    match = _LEADING_INT.match(text) if text is not None else None
    return int(match.group(1)) if match else None
