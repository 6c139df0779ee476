"""The one error table: each code's status and its type in OpenAI's and Anthropic's envelopes."""

from __future__ import annotations

import orjson
import pytest

from epp.errors import (
    STATUS_BY_CODE,
    WIRE_BY_CODE,
    BadRequest,
    EppError,
    ErrorCode,
    InternalError,
    NoCandidates,
    NotFound,
    NotImplementedByEpp,
    PayloadTooLarge,
    Saturated,
    SchedulingFailed,
    UpstreamError,
    UpstreamTimeout,
    anthropic_error_body,
    error_body,
    openai_error_body,
)


@pytest.mark.parametrize("err, status, openai_type, anthropic_type", [
    (BadRequest("x"), 400, "invalid_request_error", "invalid_request_error"),
    (NotFound("x"), 404, "not_found_error", "not_found_error"),
    (SchedulingFailed("x"), 429, "rate_limit_error", "rate_limit_error"),
    (Saturated("x"), 429, "rate_limit_error", "rate_limit_error"),
    (InternalError("x"), 500, "server_error", "api_error"),
    (NoCandidates("x"), 503, "server_error", "overloaded_error"),
    (PayloadTooLarge("x"), 413, "invalid_request_error", "request_too_large"),
    (UpstreamError("x"), 502, "server_error", "api_error"),
    (UpstreamTimeout("x"), 504, "server_error", "timeout_error"),
    (NotImplementedByEpp("x"), 501, "invalid_request_error", "invalid_request_error"),
], ids=lambda v: type(v).__name__ if isinstance(v, EppError) else str(v))
def test_each_error_has_one_status_and_a_type_per_envelope(err: EppError, status: int, openai_type: str,
                                                           anthropic_type: str) -> None:
    """The first five rows are the reference's ``wireCodes`` (``pkg/common/error/error.go``), both columns."""
    assert err.status == status == STATUS_BY_CODE[err.code]
    assert orjson.loads(openai_error_body(err))["error"]["type"] == openai_type
    assert orjson.loads(anthropic_error_body(err)) == {"type": "error",
                                                       "error": {"type": anthropic_type, "message": "x"}}


def test_every_code_has_a_row_and_the_status_view_is_derived_from_it() -> None:
    assert set(WIRE_BY_CODE) == set(ErrorCode)
    assert dict(STATUS_BY_CODE) == {code: wire.status for code, wire in WIRE_BY_CODE.items()}


def test_error_body_picks_the_envelope() -> None:
    err = BadRequest("model not found in request body", param="model")
    assert error_body(err, anthropic=False) == openai_error_body(err)
    assert orjson.loads(error_body(err, anthropic=True)) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "model not found in request body"}}
