"""Shared by the parsers of model-server-native bodies: gRPC message framing, the request path, and requests
built from headers.

gRPC frames a message as a 1-byte compressed flag, a 4-byte big-endian length and the message bytes. Request
bodies are decoded as the reference's ``parsers/util/grpc.go`` ``ParseGrpcPayload`` does: the first message only,
flag 1 (compressed) refused. Response bodies arrive in arbitrary chunks and hold a stream of messages:
:class:`GrpcFrames` reassembles them.
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from epp.errors import BadRequest
from epp.framework.request import (
    CHARS_PER_TOKEN,
    DEFAULT_FAIRNESS_ID,
    FAIRNESS_ID_HEADER,
    MODEL_REWRITE_HEADER,
    OBJECTIVE_HEADER,
    REQUEST_ID_HEADER,
    SESSION_HEADER,
    ApiKind,
    InferenceRequest,
    header_text,
    new_request_id,
    utf8_len,
)

__all__ = ["GRPC_HEADER_LEN", "grpc_payload", "GrpcFrames", "request_path", "headers_request", "skipped_request",
           "token_prompt", "text_prompt"]

GRPC_HEADER_LEN = 5
_MAX_RESPONSE_MESSAGE = 16 << 20  # a response message above this is skipped, not buffered (usage frames are tiny)


def grpc_payload(data: bytes) -> bytes:
    """The message of the first gRPC frame in ``data``; bytes after it are ignored, as in the reference.

    ``BadRequest`` (400): ``invalid gRPC frame`` when there are fewer than 5 bytes, ``compressed gRPC payload is
    not supported`` when the flag byte is 1 (the only value the reference treats as compressed), ``incomplete gRPC
    payload`` when the length names more bytes than there are.
    """
    if len(data) < GRPC_HEADER_LEN:
        raise BadRequest(f"invalid gRPC frame: expected at least {GRPC_HEADER_LEN} bytes for header, "
                         f"got {len(data)}")
    if data[0] == 1:
        raise BadRequest("compressed gRPC payload is not supported")
    size = int.from_bytes(data[1:GRPC_HEADER_LEN], "big")
    if len(data) < GRPC_HEADER_LEN + size:
        raise BadRequest(f"incomplete gRPC payload: header indicates {size} bytes, but only "
                         f"{len(data) - GRPC_HEADER_LEN} bytes are available")
    return data[GRPC_HEADER_LEN:GRPC_HEADER_LEN + size]


class GrpcFrames:
    """Splits a gRPC response body, fed in arbitrary chunks, into its messages.

    :meth:`feed` returns the messages completed by a chunk. Compressed messages (flag 1) and messages larger than
    16 MiB are skipped: their bytes are consumed but not returned. Never raises.
    """

    __slots__ = ("_buf", "_skip")

    def __init__(self) -> None:
        self._buf = b""
        self._skip = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """The messages whose last byte is in ``chunk``."""
        if self._skip:
            dropped = min(self._skip, len(chunk))
            self._skip -= dropped
            chunk = chunk[dropped:]
        buf = self._buf + chunk if self._buf else chunk
        out: list[bytes] = []
        while len(buf) >= GRPC_HEADER_LEN:
            size = int.from_bytes(buf[1:GRPC_HEADER_LEN], "big")
            end = GRPC_HEADER_LEN + size
            if buf[0] == 1 or size > _MAX_RESPONSE_MESSAGE:
                self._skip = max(0, end - len(buf))
                buf = buf[end:]
                continue
            if len(buf) < end:
                break
            out.append(buf[GRPC_HEADER_LEN:end])
            buf = buf[end:]
        self._buf = buf
        return out


def request_path(path: str, headers: Mapping[str, str]) -> str:
    """The request path without its query, as the reference's ``GetRequestPath`` reads it: ``path`` (the
    front end's ``:path``), else the ``x-original-path`` or ``x-forwarded-path`` header."""
    for value in (path, headers.get("x-original-path"), headers.get("x-forwarded-path")):
        if value:
            return value.split("?", 1)[0]
    return ""


def headers_request(headers: Mapping[str, str], body_size: int, **fields: Any) -> InferenceRequest:
    """An :class:`InferenceRequest` whose request id, fairness id, objective, session token and target model
    come from the headers as :func:`epp.framework.request.parse_request` reads them, and whose model, when ``fields`` has
    none, is the ``x-llm-d-router-model-name-rewrite`` header (else ""), as for ``passthrough-parser``.
    ``fields`` gives the rest (``api``, ``prompt_text``, ``input_tokens`` are required)."""
    rewrite = header_text(headers, MODEL_REWRITE_HEADER) or ""
    fields.setdefault("model", rewrite)
    fields.setdefault("target_model", rewrite)
    fields.setdefault("body", {})
    return InferenceRequest(
        request_id=header_text(headers, REQUEST_ID_HEADER) or new_request_id(),
        headers=headers,
        fairness_id=header_text(headers, FAIRNESS_ID_HEADER) or DEFAULT_FAIRNESS_ID,
        objective=header_text(headers, OBJECTIVE_HEADER),
        session_token=header_text(headers, SESSION_HEADER),
        body_size=body_size,
        **fields,
    )


def skipped_request(body: bytes, headers: Mapping[str, str]) -> InferenceRequest:
    """A request for a method the parser does not read: routed with nothing taken from the body (no prompt for
    prefix hashing, tokens estimated as bytes / 4), its body forwarded unchanged; the reference's
    ``SkipResponseProcessing`` result with a raw payload."""
    return headers_request(headers, len(body), api=ApiKind.COMPLETIONS, prompt_text="",
                           input_tokens=max(1, len(body) // CHARS_PER_TOKEN), model_rewritable=False)


def token_prompt(ids: list[int]) -> tuple[str, int]:
    """``(prompt_text, input_tokens)`` of a pre-tokenized prompt: the ids as JSON text (what prefix hashing
    sees, as for an OpenAI completions prompt of token ids) and their exact count (at least 1)."""
    return orjson.dumps(ids).decode(), max(1, len(ids))


def text_prompt(text: str) -> tuple[str, int]:
    """``(prompt_text, input_tokens)`` of a text prompt: the text and its UTF-8 bytes / 4 (at least 1)."""
    return text, max(1, utf8_len(text) // CHARS_PER_TOKEN)
