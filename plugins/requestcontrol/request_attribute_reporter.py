"""``request-attribute-reporter``: reports a value computed from the response's token usage to the proxy, as
ext_proc dynamic metadata.

When a request completes, ``condition`` (optional CEL, a bool) decides whether to report and ``expression`` (CEL,
a number over ``usage = {prompt_tokens, completion_tokens, total_tokens[, prompt_token_details]}``, every number a
double) is truncated to an integer and set as ``dynamic_metadata[namespace][name]`` on the last response reply of
the ext_proc stream. A result truncating to 0 or -1 is not reported; an expression failing at run time reports
nothing and logs why. Expressions are compiled at start-up (an error names the plugin and field). The OpenAI
gateway has no such channel: there the value is computed and dropped.

YAML::

    - name: total-tokens-cost-reporter
      type: request-attribute-reporter
      parameters:
        attributes:
        - key: {namespace: envoy.lb, name: x-gateway-inference-request-cost}   # namespace defaults to envoy.lb
          expression: usage.prompt_tokens + usage.completion_tokens
          condition: "has(usage.completion_tokens)"
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from pydantic import Field

from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import Handle, Params, ResponseComplete, ResponseInfo
from epp.framework.request import InferenceRequest

__all__ = ["RequestAttributeReporter", "AttributeKey", "Attribute", "ReporterParams", "usage_struct"]

log = logging.getLogger("epp.plugins.request_attribute_reporter")

DEFAULT_NAMESPACE = "envoy.lb"
_NOT_REPORTED = (0, -1)
"""Truncated results the reference never writes: 0 (skipped) and -1 (its type-error marker)."""
_INT64_MIN = -(2 ** 63)


class AttributeKey(Params):
    namespace: str = ""
    name: str = ""


class Attribute(Params):
    key: AttributeKey = Field(default_factory=AttributeKey)
    expression: str = ""
    condition: str = ""


class ReporterParams(Params):
    attributes: list[Attribute] = Field(default_factory=list)


def usage_struct(info: ResponseInfo) -> dict[str, Any]:
    """The CEL ``usage`` variable: the reference's Usage marshalled to JSON and read as a Struct (zero when the
    answer reported no usage; numbers as doubles; the cached-token details only when known)."""
    prompt, completion = info.prompt_tokens or 0, info.completion_tokens or 0
    usage: dict[str, Any] = {"prompt_tokens": float(prompt), "completion_tokens": float(completion),
                             "total_tokens": float(prompt + completion)}
    if info.cached_tokens is not None:
        usage["prompt_token_details"] = {"cached_tokens": float(info.cached_tokens)}
    return usage


def _compile(source: str, fld: str) -> Any:
    """Compile a CEL expression over ``usage``; ConfigError on a syntax error or another variable."""
    import cel  # the CEL runtime is loaded only by configs that use this plugin

    try:
        program = cel.compile(source)
    except ValueError as exc:
        raise ConfigError(f"failed to compile {fld.rsplit('.', 1)[-1]}: {exc}", field=fld) from exc
    unknown = sorted(set(program.variables()) - {"usage"})
    if unknown:
        raise ConfigError(f"failed to compile {fld.rsplit('.', 1)[-1]}: undeclared reference to "
                          f"'{unknown[0]}' (only 'usage' is defined)", field=fld)
    return program


class RequestAttributeReporter:
    """A ``ResponseComplete`` hook that writes one CEL-computed integer into the response's dynamic metadata."""

    type_name: ClassVar[str] = "request-attribute-reporter"
    Params = ReporterParams

    def __init__(self, name: str, params: ReporterParams, handle: Handle) -> None:
        self.name = name
        self.params = params
        if len(params.attributes) != 1:
            raise ConfigError("attributes must contain exactly one entry", field="attributes")
        attr = params.attributes[0]
        if not attr.key.name:
            raise ConfigError("attributes[0].key.name cannot be empty", field="attributes.0.key.name")
        if not attr.expression.strip():
            raise ConfigError("attributes[0].expression cannot be empty", field="attributes.0.expression")
        self.namespace = attr.key.namespace or DEFAULT_NAMESPACE
        self.key = attr.key.name
        self._expression = _compile(attr.expression, "attributes.0.expression")
        self._condition = _compile(attr.condition, "attributes.0.condition") if attr.condition.strip() else None

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, info: ResponseInfo) -> None:
        value = self.evaluate(usage_struct(info), request.request_id)
        if value is not None:
            info.set_metadata(self.namespace, self.key, float(value))

    def evaluate(self, usage: dict[str, Any], request_id: str = "") -> int | None:
        """The integer to report for ``usage``, or None (condition false, evaluation error, not a number, or a
        result of 0 or -1, which the reference does not report)."""
        context = {"usage": usage}
        try:
            if self._condition is not None and self._condition.execute(context) is not True:
                return None
            value = self._expression.execute(context)
        except Exception as exc:  # noqa: BLE001 - a CEL run-time error reports nothing for this request only
            log.warning("%s: request %s: evaluation failed: %s", self.name, request_id, exc)
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            log.warning("%s: request %s: expression gave %r, not a number", self.name, request_id, value)
            return None
        truncated = _go_int64(value)
        return None if truncated in _NOT_REPORTED else truncated


def _go_int64(value: int | float) -> int:
    """``int64(float64(value))`` as Go compiles it for amd64: truncation toward zero; NaN, infinities and anything
    outside the int64 range give -2**63 (the CPU's "integer indefinite" value)."""
    value = float(value)  # the reference reads an int64 result through float64 too
    if value != value or not -2.0 ** 63 <= value < 2.0 ** 63:
        return _INT64_MIN
    return int(value)


_check: type[ResponseComplete] = RequestAttributeReporter
