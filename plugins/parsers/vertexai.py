"""``vertexai-parser``: Vertex AI's gRPC PredictionService, whose messages wrap an OpenAI JSON body in a
``google.api.HttpBody``.

The method is the ``:path`` suffix: ``PredictionService/ChatCompletions`` is read as an OpenAI chat completions
body, ``PredictionService/StreamRawPredict`` and ``RawPredict`` as a Responses API body, any other method not at all
(routed with nothing taken from the body). The JSON is read as ``openai-parser`` reads it, ``model`` optional; a
malformed frame or body is a ``BadRequest`` (400). The body is forwarded unchanged (``model_rewritable`` is False).
:meth:`VertexAIParser.usage_reader` reads the OpenAI usage from the response's ``HttpBody`` messages. Reached
through ext_proc only.

YAML::

    plugins:
    - type: vertexai-parser
    requestHandler:
      parsers:
      - pluginRef: vertexai-parser   # the deprecated top-level parser: {pluginRef: vertexai-parser} still works
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import orjson
from google.protobuf.message import DecodeError

from epp._pb.engines import vertexai_pb2 as pb
from epp.errors import BadRequest
from epp.framework.plugins import Handle, NoParams
from epp.framework.request import InferenceRequest, parse_request
from epp.usage import NO_USAGE, Usage, usage_of

from ._wire import GrpcFrames, grpc_payload, skipped_request

__all__ = ["VertexAIParser", "VertexUsageReader"]

# (method path suffix, request message, the OpenAI path its JSON is parsed as)
_METHODS: tuple[tuple[str, type, str], ...] = (
    ("PredictionService/ChatCompletions", pb.ChatCompletionsRequest, "/chat/completions"),
    ("PredictionService/StreamRawPredict", pb.StreamRawPredictRequest, "/responses"),
    ("PredictionService/RawPredict", pb.RawPredictRequest, "/responses"),
)


class VertexAIParser:
    """``parse(path, body, headers)``: the OpenAI request inside a Vertex AI gRPC message (see the module doc),
    or a ``BadRequest``; ``usage_reader`` reads the usage out of the gRPC ``HttpBody`` responses."""

    type_name: ClassVar[str] = "vertexai-parser"
    claims: ClassVar[tuple[str, ...]] = tuple(suffix for suffix, _, _ in _METHODS)
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def parse(self, path: str, body: bytes, headers: dict[str, str]) -> InferenceRequest:
        for suffix, message, openai_path in _METHODS:
            if path.endswith(suffix):
                return _parse_wrapped(body, headers, message, openai_path)
        return skipped_request(body, headers)

    def usage_reader(self, request: InferenceRequest, sse: bool) -> VertexUsageReader:
        """A reader of the usage in this request's gRPC response (``sse`` does not matter: the framing is gRPC)."""
        return VertexUsageReader()


def _parse_wrapped(body: bytes, headers: Mapping[str, str], message: Any, openai_path: str) -> InferenceRequest:
    # ``message``: a request class of the generated (untyped) vertexai_pb2 with an ``http_body`` field.
    name = message.__name__
    try:
        payload = grpc_payload(body)
    except BadRequest as exc:
        raise BadRequest(f"invalid or unsupported gRPC payload: {exc.message}") from None
    try:
        decoded = message.FromString(payload)
    except DecodeError:
        raise BadRequest(f"unmarshaling {name}: not a valid protobuf {name}") from None
    if not decoded.HasField("http_body"):
        raise BadRequest(f"{name} has no HttpBody")
    try:
        request = parse_request(openai_path, decoded.http_body.data, headers, require_model=False)
    except BadRequest as exc:
        raise type(exc)(f"parsing {name}: {exc.message}", param=exc.param) from None
    request.body_size = len(body)
    request.model_rewritable = False
    return request


class VertexUsageReader:
    """Usage from a stream of gRPC ``HttpBody`` messages: each one's ``data`` is an OpenAI JSON response, or SSE
    ``data:`` lines; the last usage found wins. Malformed messages are skipped."""

    __slots__ = ("_frames", "_usage")

    def __init__(self) -> None:
        self._frames = GrpcFrames()
        self._usage: Usage = NO_USAGE

    def feed(self, chunk: bytes) -> None:
        for message in self._frames.feed(chunk):
            try:
                data = pb.HttpBody.FromString(message).data
            except DecodeError:
                continue
            usage = _data_usage(data)
            if usage != NO_USAGE:
                self._usage = usage

    def usage(self) -> Usage:
        return self._usage


def _data_usage(data: bytes) -> Usage:
    """The usage in one ``HttpBody.data``: a JSON object, or SSE lines (the last event with a usage)."""
    if data.find(b'"usage"') < 0:
        return NO_USAGE
    if not data.lstrip().startswith(b"data:"):
        return _json_usage(data)
    found = NO_USAGE
    for line in data.split(b"\n"):
        line = line.strip()
        if line.startswith(b"data:") and line.find(b'"usage"') >= 0:
            usage = _json_usage(line[5:])
            found = usage if usage != NO_USAGE else found
    return found


def _json_usage(text: bytes) -> Usage:
    try:
        return usage_of(orjson.loads(text))
    except orjson.JSONDecodeError:
        return NO_USAGE
