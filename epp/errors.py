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
    ├── Saturated                           -- 429: sheddable request dropped, or a queue/quota is full
    ├── RequestExpired                      -- 503: waited in a flow-control queue past its TTL
    ├── UpstreamError                       -- 502: model server unreachable / failed before any byte
    ├── UpstreamTimeout                     -- 504: model server too slow
    └── InternalError                       -- 500
    ConfigError(message, plugin, field, line) -- start-up only; never reaches a client

``STATUS_BY_CODE`` is the only place a code becomes a status; the ext_proc ``ImmediateResponse`` and the
HTTP gateway both read it through :func:`http_status`.

A request EPP drops before any model server saw it also tells why in the response header
``x-llm-d-request-dropped-reason`` (:data:`DROPPED_REASON_HEADER`; the current reference's values, llm-d-router
``pkg/common/error``): ``rejected-no-endpoints`` (:class:`NoCandidates`), ``rejected-saturated``
(:class:`Saturated`: shed, or a queue or quota full), ``rejected-ttl-expired`` (:class:`RequestExpired`) and
``rejected-shutting-down`` (flow control stopping). :func:`error_headers` gives it for an error.
"""

from __future__ import annotations

from enum import StrEnum

import orjson

__all__ = [
    "ErrorCode", "EppError", "BadRequest", "InvalidJson", "BodyNotObject", "MissingModel", "InvalidShape",
    "PayloadTooLarge", "NotFound", "NotImplementedByEpp", "NoCandidates", "SchedulingFailed", "Saturated", "RequestExpired",
    "UpstreamError", "UpstreamTimeout", "InternalError", "ConfigError", "STATUS_BY_CODE", "http_status",
    "openai_error_body", "DROPPED_REASON_HEADER", "error_headers",
]

DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"


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


STATUS_BY_CODE: dict[ErrorCode, int] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.SERVICE_UNAVAILABLE: 503,
    ErrorCode.RESOURCE_EXHAUSTED: 429,
    ErrorCode.UPSTREAM: 502,
    ErrorCode.UPSTREAM_TIMEOUT: 504,
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_IMPLEMENTED: 501,
}

_OPENAI_TYPE: dict[ErrorCode, str] = {
    ErrorCode.BAD_REQUEST: "invalid_request_error",
    ErrorCode.PAYLOAD_TOO_LARGE: "invalid_request_error",
    ErrorCode.NOT_FOUND: "not_found_error",
    ErrorCode.RESOURCE_EXHAUSTED: "rate_limit_error",
    ErrorCode.NOT_IMPLEMENTED: "invalid_request_error",  # a request feature the server lacks: the request's to change
}


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
    return STATUS_BY_CODE.get(code, 500)


def error_headers(err: EppError) -> tuple[tuple[str, str], ...]:
    """The response headers ``err`` adds to its error answer: the drop reason, when it has one."""
    return ((DROPPED_REASON_HEADER, err.dropped),) if err.dropped is not None else ()


def openai_error_body(err: EppError) -> bytes:
    """Serialize ``err`` as an OpenAI-style error body: ``{"error": {message, type, param, code}}``."""
    payload = {
        "error": {
            "message": err.message,
            "type": _OPENAI_TYPE.get(err.code, "server_error" if err.status >= 500 else "invalid_request_error"),
            "param": err.param,
            "code": err.reason or err.code.value,
        }
    }
    return orjson.dumps(payload)
