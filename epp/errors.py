"""EPP's error hierarchy and the one table that maps it to HTTP statuses.

::

    EppError(code, message)                 -- every request-path failure; carries an ErrorCode
    ├── BadRequest                          -- 400: the body cannot be routed
    │   ├── InvalidJson                     -- body is not JSON
    │   ├── BodyNotObject                   -- JSON, but not an object
    │   ├── MissingModel                    -- no "model", or not a string
    │   └── InvalidShape                    -- wrong shape for the path (chat without "messages", ...)
    ├── PayloadTooLarge                     -- 413: body above the configured limit
    ├── NotFound                            -- 404: unknown path
    ├── NoCandidates                        -- 503: empty pool or empty subset
    ├── SchedulingFailed                    -- 429: every endpoint filtered out / profile failed (reference)
    ├── Saturated                           -- 429: sheddable request dropped, a queue/quota is full, or it
    │                                              waited out defaultRequestTTL while its pool had endpoints
    ├── RequestExpired                      -- 503: waited out noEndpointRequestTTL with no endpoint, or shutdown
    ├── UpstreamError                       -- 502: model server unreachable / failed before any byte
    ├── UpstreamTimeout                     -- 504: model server too slow
    └── InternalError                       -- 500
    ConfigError(message, plugin, field, line) -- start-up only; never reaches a client

``WIRE_BY_CODE`` is the only place a code becomes a status and an error type; both front ends read it through
:func:`http_status` and :func:`error_body` (Anthropic's envelope for ``/v1/messages``, OpenAI's otherwise).
:func:`error_headers` gives the dropped-reason headers of a request dropped before any model server saw it.
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType
from typing import Mapping, NamedTuple

import orjson

__all__ = [
    "ErrorCode", "EppError", "BadRequest", "InvalidJson", "BodyNotObject", "MissingModel", "InvalidShape",
    "PayloadTooLarge", "NotFound", "NotImplementedByEpp", "NoCandidates", "SchedulingFailed", "Saturated",
    "RequestExpired", "UpstreamError", "UpstreamTimeout", "InternalError", "ConfigError", "WireCode", "WIRE_BY_CODE",
    "STATUS_BY_CODE", "http_status", "openai_error_body", "anthropic_error_body", "error_body",
    "DROPPED_REASON_HEADER", "DROPPED_REASON_ALIAS", "error_headers",
]

# The drop reason's two header names live here, below epp.headers (whose table imports them): epp.headers raises
# ConfigError, so this module must not import it.
DROPPED_REASON_HEADER = "x-llm-d-router-request-dropped-reason"
"""Response header: why EPP dropped a request before any model server saw it."""
DROPPED_REASON_ALIAS = "x-llm-d-request-dropped-reason"
"""Its deprecated alias (llm-d's earlier name), still sent beside it as the reference sends both."""
_DROPPED_REASON_NAMES = (DROPPED_REASON_HEADER, DROPPED_REASON_ALIAS)


class ErrorCode(StrEnum):
    """Error codes; the string values are the reference's ``error_code`` metric label values."""

    BAD_REQUEST = "BadRequest"
    PAYLOAD_TOO_LARGE = "PayloadTooLarge"
    NOT_FOUND = "NotFound"
    SERVICE_UNAVAILABLE = "ServiceUnavailable"
    RESOURCE_EXHAUSTED = "ResourceExhausted"
    UPSTREAM = "ModelServerError"
    UPSTREAM_TIMEOUT = "ModelServerTimeout"
    INTERNAL = "Internal"
    NOT_IMPLEMENTED = "NotImplemented"


class WireCode(NamedTuple):
    """How an error code appears on the wire: the HTTP status and the error ``type`` of each API's envelope."""

    status: int
    openai: str
    anthropic: str


WIRE_BY_CODE: Mapping[ErrorCode, WireCode] = MappingProxyType({
    # The reference's rows (its openAI and anthropic columns)...
    ErrorCode.BAD_REQUEST: WireCode(400, "invalid_request_error", "invalid_request_error"),
    ErrorCode.NOT_FOUND: WireCode(404, "not_found_error", "not_found_error"),
    ErrorCode.RESOURCE_EXHAUSTED: WireCode(429, "rate_limit_error", "rate_limit_error"),
    ErrorCode.INTERNAL: WireCode(500, "server_error", "api_error"),
    ErrorCode.SERVICE_UNAVAILABLE: WireCode(503, "server_error", "overloaded_error"),
    # ...and EPP's own codes, with the types Anthropic's API documents for these statuses.
    ErrorCode.PAYLOAD_TOO_LARGE: WireCode(413, "invalid_request_error", "request_too_large"),
    ErrorCode.UPSTREAM: WireCode(502, "server_error", "api_error"),
    ErrorCode.UPSTREAM_TIMEOUT: WireCode(504, "server_error", "timeout_error"),
    # A request feature the server lacks: the request's to change.
    ErrorCode.NOT_IMPLEMENTED: WireCode(501, "invalid_request_error", "invalid_request_error"),
})

STATUS_BY_CODE: Mapping[ErrorCode, int] = MappingProxyType({code: w.status for code, w in WIRE_BY_CODE.items()})
"""The status column of :data:`WIRE_BY_CODE` (derived from it, never edited on its own)."""

_UNMAPPED = WireCode(500, "server_error", "api_error")


class EppError(Exception):
    """A request-path failure with a code; ``param`` names the offending body field when there is one."""

    code: ErrorCode = ErrorCode.INTERNAL
    default_reason: str | None = None
    """The OpenAI ``code`` of this kind of error when the raiser gives no ``reason`` (else ``code``'s value)."""
    default_dropped: str | None = None
    """The ``x-llm-d-request-dropped-reason`` value of this kind of error when the raiser gives no ``dropped``."""

    def __init__(self, message: str, *, param: str | None = None, reason: str | None = None,
                 dropped: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.reason = reason if reason is not None else self.default_reason
        self.dropped = dropped if dropped is not None else self.default_dropped

    @property
    def status(self) -> int:
        """The HTTP status this error maps to."""
        return http_status(self.code)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class BadRequest(EppError):
    code = ErrorCode.BAD_REQUEST


class InvalidJson(BadRequest):
    pass


class BodyNotObject(BadRequest):
    pass


class MissingModel(BadRequest):
    pass


class InvalidShape(BadRequest):
    pass


class PayloadTooLarge(EppError):
    code = ErrorCode.PAYLOAD_TOO_LARGE
    default_reason = "body_too_large"  # the same OpenAI code from both front ends


class NotFound(EppError):
    code = ErrorCode.NOT_FOUND


class NotImplementedByEpp(EppError):
    """A request feature EPP's HTTP server does not implement (a transfer coding other than chunked)."""

    code = ErrorCode.NOT_IMPLEMENTED


class NoCandidates(EppError):
    code = ErrorCode.SERVICE_UNAVAILABLE
    default_dropped = "rejected-no-endpoints"


class SchedulingFailed(EppError):
    code = ErrorCode.RESOURCE_EXHAUSTED


class Saturated(EppError):
    code = ErrorCode.RESOURCE_EXHAUSTED
    default_dropped = "rejected-saturated"


class RequestExpired(EppError):
    code = ErrorCode.SERVICE_UNAVAILABLE
    default_dropped = "rejected-ttl-expired"


class UpstreamError(EppError):
    code = ErrorCode.UPSTREAM


class UpstreamTimeout(EppError):
    code = ErrorCode.UPSTREAM_TIMEOUT


class InternalError(EppError):
    code = ErrorCode.INTERNAL


class ConfigError(Exception):
    """An invalid configuration, raised at start-up; the message names the plugin, field and file line."""

    def __init__(self, message: str, *, plugin: str | None = None, field: str | None = None,
                 line: int | None = None, source: str | None = None) -> None:
        self.plugin, self.field, self.line, self.source = plugin, field, line, source
        where = ""
        if source is not None or line is not None:
            where = f"{source or '<config>'}" + (f":{line}" if line is not None else "") + ": "
        super().__init__(where + message)


def http_status(code: ErrorCode) -> int:
    """Map an error code to its HTTP status (500 for anything unmapped)."""
    return WIRE_BY_CODE.get(code, _UNMAPPED).status


def error_headers(err: EppError) -> tuple[tuple[str, str], ...]:
    """The response headers ``err`` adds to its error answer: the drop reason under both its names, when it has
    one."""
    dropped = err.dropped
    return tuple((name, dropped) for name in _DROPPED_REASON_NAMES) if dropped is not None else ()


def openai_error_body(err: EppError) -> bytes:
    """Serialize ``err`` as an OpenAI-style error body: ``{"error": {message, type, param, code}}``."""
    payload = {
        "error": {
            "message": err.message,
            "type": WIRE_BY_CODE.get(err.code, _UNMAPPED).openai,
            "param": err.param,
            "code": err.reason or err.code.value,
        }
    }
    return orjson.dumps(payload)


def anthropic_error_body(err: EppError) -> bytes:
    """Serialize ``err`` as an Anthropic Messages API error body: ``{"type": "error", "error": {type, message}}``,
    the type from the table's anthropic column (as the reference's ``errorBody`` for ``APITypeMessages``)."""
    payload = {"type": "error", "error": {"type": WIRE_BY_CODE.get(err.code, _UNMAPPED).anthropic,
                                          "message": err.message}}
    return orjson.dumps(payload)


def error_body(err: EppError, *, anthropic: bool) -> bytes:
    """``err`` in the envelope of the API the request was sent to: Anthropic's for the Messages API, else
    OpenAI's."""
    return anthropic_error_body(err) if anthropic else openai_error_body(err)
