"""The Endpoint Picker protocol on the wire: names, and builders for the ext_proc messages EPP sends.

Everything here is synchronous and allocation-light; constant replies are serialized once at import and sent as
bytes (the gRPC serializer passes bytes through). Header values are read from ``raw_value`` (Envoy leaves
``value`` empty) and written to ``raw_value``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from google.protobuf import json_format

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._pb.envoy.type.v3 import http_status_pb2
from epp.errors import EppError, error_body, error_headers
from epp.headers import (
    DATA_PARALLEL_HEADER,
    DESTINATION_HEADER,
    ENCODER_HEADER,
    PREFILLER_HEADER,
    PRIMARY_KEY,
    SCORES_KEY,
    SERVED_HEADER,
    SUBSET_HEADER,
    header_names,
)

__all__ = [
    "pb", "SERVICE_NAME", "METHOD_PATH", "DESTINATION_HEADER", "SERVED_HEADER", "SUBSET_HEADER", "DESTINATION_KEYS",
    "SERVED_KEYS", "SUBSET_KEYS", "first_field", "served_endpoint", "filter_metadata", "PREFILLER_HEADER",
    "ENCODER_HEADER", "DATA_PARALLEL_HEADER", "PRIMARY_KEY", "SCORES_KEY",
    "LB_NAMESPACE", "SUBSET_NAMESPACE", "EXTPROC_ATTRIBUTES", "MAX_CHUNK",
    "RESPONSE_HEADERS_MARKER", "BodySendMode", "CONTINUE_REQUEST_HEADERS", "CONTINUE_RESPONSE_HEADERS",
    "RESPONSE_HEADERS_REPLY", "CONTINUE_RESPONSE_BODY",
    "CONTINUE_REQUEST_TRAILERS", "CONTINUE_RESPONSE_TRAILERS", "read_headers", "routing_mutation", "set_headers",
    "routing_metadata", "streamed_body", "immediate_error", "serialize",
]

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"
METHOD_PATH = f"/{SERVICE_NAME}/Process"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
EXTPROC_ATTRIBUTES = "envoy.filters.http.ext_proc"
MAX_CHUNK = 62_000
"""Largest body chunk EPP sends back in FULL_DUPLEX_STREAMED mode (the reference's limit)."""
RESPONSE_HEADERS_MARKER = "x-went-into-resp-headers"
"""Set to ``true`` by every response-headers reply, as the reference does: the client can see that EPP processed
the response (a debugging marker the reference's own tests and users look for)."""

BodySendMode = processing_mode_pb2.ProcessingMode.BodySendMode
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
DESTINATION_KEYS = header_names(DESTINATION_HEADER)
"""The destination header and ``envoy.lb`` key under both names (``x-llm-d-router-destination-endpoint``, then the
deprecated ``x-gateway-destination-endpoint``): EPP writes both, as the reference does."""
SERVED_KEYS = header_names(SERVED_HEADER)
"""Where a gateway reports the served endpoint in ``envoy.lb``: current name first, then the deprecated one."""
SUBSET_KEYS = header_names(SUBSET_HEADER)
"""Where a gateway puts the subset hint in ``envoy.lb.subset_hint``: current name first, then the deprecated one."""
_PROTECTED = (*SERVED_KEYS, PREFILLER_HEADER, *SUBSET_KEYS, ENCODER_HEADER, DATA_PARALLEL_HEADER)
"""Headers besides the destination only EPP may set on the upstream request: a client's copy is removed unless EPP
sets the header itself (the destination headers are always overwritten)."""


def first_field(fields: Any, keys: tuple[str, ...]) -> Any:
    """The value of the first of ``keys`` present in a protobuf Struct's ``fields`` (current name before its
    deprecated aliases: the first key present decides), or None."""
    key = next((k for k in keys if k in fields), None)
    return fields[key] if key is not None else None


def served_endpoint(req: pb.ProcessingRequest) -> str:
    """The ``host:port`` Envoy reports it sent the request to: ``envoy.lb`` metadata under the current served key,
    else the deprecated one, else the ``upstream.address`` attribute; "" when it reports none."""
    if req.HasField("metadata_context"):
        md = req.metadata_context.filter_metadata
        value = first_field(md[LB_NAMESPACE].fields, SERVED_KEYS) if LB_NAMESPACE in md else None
        if value is not None and value.string_value:
            return str(value.string_value)
    if EXTPROC_ATTRIBUTES in req.attributes:
        fields = req.attributes[EXTPROC_ATTRIBUTES].fields
        if "upstream.address" in fields:
            return str(fields["upstream.address"].string_value)
    return ""


def filter_metadata(req: pb.ProcessingRequest) -> dict[str, dict[str, Any]]:
    """The message's ``metadata_context.filter_metadata`` as plain values (namespace -> key -> value)."""
    if not req.HasField("metadata_context"):
        return {}
    return {ns: json_format.MessageToDict(st) for ns, st in req.metadata_context.filter_metadata.items()}


def serialize(message: pb.ProcessingResponse | bytes) -> bytes:
    """gRPC response serializer: pre-serialized bytes pass through, messages are serialized."""
    return message if isinstance(message, bytes) else message.SerializeToString()


CONTINUE_REQUEST_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse()).SerializeToString()
CONTINUE_RESPONSE_HEADERS = pb.ProcessingResponse(response_headers=pb.HeadersResponse()).SerializeToString()
CONTINUE_RESPONSE_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse()).SerializeToString()
CONTINUE_REQUEST_TRAILERS = pb.ProcessingResponse(request_trailers=pb.TrailersResponse()).SerializeToString()
CONTINUE_RESPONSE_TRAILERS = pb.ProcessingResponse(response_trailers=pb.TrailersResponse()).SerializeToString()


def read_headers(header_map: base_pb2.HeaderMap) -> dict[str, str]:
    """Header names to values (``raw_value`` preferred, as the reference); a repeated name keeps the last."""
    return {h.key: (h.raw_value.decode("latin-1") if h.raw_value else h.value) for h in header_map.headers}


def routing_mutation(common: pb.CommonResponse, destination: str, extra: Mapping[str, str],
                     client_headers: Mapping[str, str], remove: Sequence[str] | None = None) -> None:
    """Fill ``common`` to route: overwrite the destination headers, set ``extra`` headers, strip spoofed ones.

    Both destination headers (:data:`DESTINATION_KEYS`) are always overwritten. ``remove`` names the request
    headers to remove (the stream's :meth:`epp.headers.HeaderTrust.strip` result); without it, any other protocol
    header the client sent (served and subset under either name, and the P/D sidecar's
    prefiller/encoder/data-parallel headers) is removed. A header EPP sets here is never removed.
    ``clear_route_cache`` makes Envoy re-match the route against the new headers and metadata.
    """
    common.clear_route_cache = True
    mutation = common.header_mutation
    value = destination.encode()
    for key in DESTINATION_KEYS:
        opt = mutation.set_headers.add()
        opt.header.key = key
        opt.header.raw_value = value
        opt.append_action = _OVERWRITE
    set_headers(mutation, extra)
    if remove is None:
        remove = [key for key in _PROTECTED if key in client_headers]
    for key in remove:
        if key not in extra and key not in DESTINATION_KEYS:
            mutation.remove_headers.append(key)


def set_headers(mutation: Any, headers: Mapping[str, str]) -> None:
    """Add overwrite-or-add ``set_headers`` entries (``raw_value``, as Envoy expects) to a ``HeaderMutation``."""
    for key, value in headers.items():
        opt = mutation.set_headers.add()
        opt.header.key = key
        opt.header.raw_value = value.encode()
        opt.append_action = _OVERWRITE


def _marked_response_headers() -> bytes:
    msg = pb.ProcessingResponse()
    set_headers(msg.response_headers.response.header_mutation, {RESPONSE_HEADERS_MARKER: "true"})
    return msg.SerializeToString()


RESPONSE_HEADERS_REPLY = _marked_response_headers()
"""The response-headers reply when EPP changes nothing else there: only :data:`RESPONSE_HEADERS_MARKER`, serialized
once. A reply that adds more starts from ``pb.ProcessingResponse.FromString(RESPONSE_HEADERS_REPLY)``, so the
marker comes first, as in the reference. (:data:`CONTINUE_RESPONSE_HEADERS` stays the bare CONTINUE.)"""


def routing_metadata(response: pb.ProcessingResponse, destination: str, primary: str,
                     scores: Mapping[str, float] | None = None) -> None:
    """Set ``dynamic_metadata`` ``envoy.lb``: the protocol's destination list under both names
    (:data:`DESTINATION_KEYS`), the primary target alone (:data:`PRIMARY_KEY`) and, when ``scores`` is given
    (``--emit-endpoint-scores``), a struct of ``ip:port`` -> score under :data:`SCORES_KEY`."""
    fields = response.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields
    for key in DESTINATION_KEYS:
        fields[key].string_value = destination
    fields[PRIMARY_KEY].string_value = primary
    if scores:
        score_fields = fields[SCORES_KEY].struct_value.fields
        for hostport, score in scores.items():
            score_fields[hostport].number_value = score


def streamed_body(body: bytes, *, request: bool, end_of_stream: bool) -> list[pb.ProcessingResponse]:
    """``body`` as FULL_DUPLEX_STREAMED body responses of at most :data:`MAX_CHUNK` bytes each.

    An empty body still yields one (empty) chunk, so that ``end_of_stream`` reaches Envoy.
    """
    out = []
    n = len(body)
    starts = range(0, n, MAX_CHUNK) if n else (0,)
    for start in starts:
        msg = pb.ProcessingResponse()
        part = msg.request_body if request else msg.response_body
        sr = part.response.body_mutation.streamed_response
        sr.body = body[start:start + MAX_CHUNK] if n > MAX_CHUNK else body
        sr.end_of_stream = end_of_stream and start + MAX_CHUNK >= n
        out.append(msg)
    return out


def immediate_error(err: EppError, headers: Iterable[tuple[str, str]] = (), *,
                    anthropic: bool = False) -> pb.ProcessingResponse:
    """An ``ImmediateResponse`` with the error's HTTP status, a JSON error body (Anthropic's envelope when
    ``anthropic``, a request to the Messages API, else OpenAI's: the reference's ``BuildErrResponse``) and its
    headers (:func:`~epp.errors.error_headers`, then ``headers``)."""
    msg = pb.ProcessingResponse()
    imm = msg.immediate_response
    imm.status.code = cast(http_status_pb2.StatusCode, err.status)  # the enum's values are the HTTP statuses
    imm.body = error_body(err, anthropic=anthropic)
    imm.details = f"epp_{err.code.value}"
    for key, value in (("content-type", "application/json"), *error_headers(err), *headers):
        opt = imm.headers.set_headers.add()
        opt.header.key = key
        opt.header.raw_value = value.encode()
        opt.append_action = _OVERWRITE
    return msg
