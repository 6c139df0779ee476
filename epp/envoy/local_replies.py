"""The answers Envoy makes itself, as JSON errors in EPP's envelopes: the bootstrap's ``local_reply_config``.

:func:`local_reply_config` maps each of Envoy's own answers (no route, an unreachable or slow EPP or model server,
a body over the limit...) to the body of the matching :mod:`epp.errors` error: Anthropic's envelope for a
``/v1/messages`` path, OpenAI's otherwise, with ``retry-after`` on a 503. EPP's own answers (details ``epp_<code>``)
pass unchanged. The bodies keep Envoy's text and response code details through Envoy format strings.
"""

from __future__ import annotations

from typing import Any

import orjson

from epp.envoy.values import typed
from epp.errors import (
    BadRequest,
    EppError,
    InternalError,
    NoCandidates,
    NotFound,
    PayloadTooLarge,
    SchedulingFailed,
    UpstreamError,
    UpstreamTimeout,
    error_body,
)

__all__ = ["local_reply_config", "RETRY_AFTER_S"]

RETRY_AFTER_S = 1
"""``retry-after`` on Envoy's own 503s (EPP or every model server unreachable: a restart takes seconds)."""


def _cel(expression: str) -> dict[str, Any]:
    return {"extension_filter": typed("envoy.access_loggers.extension_filters.cel",
                                      "envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
                                      expression=expression)}


_EPP_ANSWER = "response.code_details.startsWith('epp_')"
"""EPP's ImmediateResponses carry ``details`` ``epp_<code>`` (:func:`epp.extproc.protocol.immediate_error`)."""
_EPP_FAILED = "response.code_details.startsWith('ext_proc_error')"
_MESSAGES_PATH = "^[^?]*/messages/?([?].*)?$"
"""A ``:path`` whose errors take Anthropic's envelope (:func:`epp.framework.request.is_messages_path`)."""


def _envoy_replies() -> list[tuple[str, EppError, int | None]]:
    """Envoy's own answers, first match wins: (CEL condition, the error whose body it gets, status to set).
    Messages are Envoy format strings: they keep the body Envoy would have sent and its response code details,
    which tell, for example, a model server that never answered from one that died after starting its answer."""
    told = "%LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)"
    return [
        (f"{_EPP_FAILED} && response.code == 504",
         UpstreamTimeout("the endpoint picker (EPP) did not answer in time (%RESPONSE_CODE_DETAILS%)",
                         reason="EndpointPickerTimeout"), None),
        (_EPP_FAILED, NoCandidates("the endpoint picker (EPP) is unavailable (%RESPONSE_CODE_DETAILS%)"), 503),
        ("response.code == 404", NotFound("no route for %REQ(:METHOD)% %REQ(:PATH)%"), None),
        ("response.code == 413", PayloadTooLarge(told), None),
        ("response.code == 429", SchedulingFailed(told), None),
        ("response.code == 502", UpstreamError(told), None),
        ("response.code == 503", NoCandidates(told), None),
        ("response.code == 504", UpstreamTimeout(told), None),
        ("response.code < 500", BadRequest(told), None),
        ("true", InternalError(told), None),
    ]


def local_reply_config() -> dict[str, Any]:
    """JSON errors for what Envoy answers itself (a 503 with ``retry-after`` when trying again helps); EPP's own
    answers pass unchanged."""
    mappers: list[dict[str, Any]] = [{"filter": _cel(_EPP_ANSWER)}]
    for anthropic in (True, False):
        for condition, err, status in _envoy_replies():
            condition = f"{condition} && request.path.matches('{_MESSAGES_PATH}')" if anthropic else condition
            mapper: dict[str, Any] = {"filter": _cel(condition), "body_format_override": {
                "json_format": orjson.loads(error_body(err, anthropic=anthropic))}}
            if status is not None:
                mapper["status_code"] = status
            if (status or err.status) == 503:
                mapper["headers_to_add"] = [{"header": {"key": "retry-after", "value": str(RETRY_AFTER_S)},
                                             "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]
            mappers.append(mapper)
    return {"mappers": mappers}
