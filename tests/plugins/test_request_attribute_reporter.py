"""request-attribute-reporter: CEL over the response's usage, reported as dynamic metadata (the reference's
plugin), and its config errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.framework.plugins import ResponseInfo
from epp.plugins.requestcontrol.request_attribute_reporter import RequestAttributeReporter, usage_struct
from epp.runtime.builtins import default_registry


def reporter(expression: str, condition: str = "", namespace: str = "") -> RequestAttributeReporter:
    text = textwrap.dedent(f"""\
        plugins:
        - name: cost
          type: request-attribute-reporter
          parameters:
            attributes:
            - key: {{namespace: "{namespace}", name: x-cost}}
              expression: "{expression}"
              condition: "{condition}"
        """)
    pipeline = build_pipeline(*load_raw(text, "t.yaml"), default_registry(entry_points=False))
    [hook] = [p for p in pipeline.response_complete if isinstance(p, RequestAttributeReporter)]
    return hook


def info(prompt: int | None = 10, completion: int | None = 5, cached: int | None = None) -> ResponseInfo:
    return ResponseInfo(status=200, prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)


def test_usage_is_the_references_struct_of_doubles() -> None:
    assert usage_struct(info(cached=4)) == {"prompt_tokens": 10.0, "completion_tokens": 5.0, "total_tokens": 15.0,
                                           "prompt_token_details": {"cached_tokens": 4.0}}
    assert usage_struct(ResponseInfo()) == {"prompt_tokens": 0.0, "completion_tokens": 0.0, "total_tokens": 0.0}


@pytest.mark.parametrize(("expression", "condition", "expected"), [
    ("usage.prompt_tokens + usage.completion_tokens", "", 15),
    ("usage.completion_tokens", "has(usage.completion_tokens)", 5),
    ("usage.total_tokens * 2.5", "", 37),  # truncated to an integer, as the reference's int64()
    ("usage.prompt_tokens", "usage.prompt_tokens > 100.0", None),  # condition false: nothing reported
    ("usage.prompt_token_details.cached_tokens", "", None),  # a missing field: an evaluation error
    ("usage.prompt_tokens + 1", "", None),  # double + int: CEL's strict typing, as cel-go
    ("'text'", "", None),  # not a number
])
def test_expression_and_condition(expression: str, condition: str, expected: int | None) -> None:
    hook = reporter(expression, condition)
    resp = info()
    hook.response_complete(_request(), None, resp)
    reported = None if resp.dynamic_metadata is None else resp.dynamic_metadata["envoy.lb"]["x-cost"]
    assert reported == expected


def test_namespace_is_configurable() -> None:
    hook = reporter("usage.completion_tokens", namespace="my.ns")
    resp = info()
    hook.response_complete(_request(), None, resp)
    assert resp.dynamic_metadata == {"my.ns": {"x-cost": 5.0}}


@pytest.mark.parametrize(("parameters", "field", "message"), [
    ("attributes: []", "attributes", "exactly one entry"),
    ("attributes: [{key: {name: a}, expression: x}, {key: {name: b}, expression: y}]", "attributes",
     "exactly one entry"),
    ("attributes: [{key: {name: ''}, expression: usage.prompt_tokens}]", "attributes.0.key.name", "cannot be empty"),
    ("attributes: [{key: {name: a}, expression: ''}]", "attributes.0.expression", "cannot be empty"),
    ("attributes: [{key: {name: a}, expression: 'usage.prompt_tokens +'}]", "attributes.0.expression",
     "failed to compile expression"),
    ("attributes: [{key: {name: a}, expression: 'request.size'}]", "attributes.0.expression",
     "undeclared reference to 'request'"),
    ("attributes: [{key: {name: a}, expression: usage.prompt_tokens, condition: 'has('}]",
     "attributes.0.condition", "failed to compile condition"),
])
def test_config_errors_name_the_plugin_and_field(parameters: str, field: str, message: str) -> None:
    text = f"plugins:\n- name: cost\n  type: request-attribute-reporter\n  parameters: {{{parameters}}}\n"
    with pytest.raises(ConfigError) as err:
        build_pipeline(*load_raw(text, "t.yaml"), default_registry(entry_points=False))
    assert err.value.plugin == "cost" and err.value.field == field and message in str(err.value)


REFERENCE_CONFIG = Path(__file__).parents[1] / "fixtures/configs/gie/integration_request-attribute-reporter-config.yaml"
"""The reference's own integration-test config: reports ``usage.completion_tokens`` when present."""


def reference_reporter() -> RequestAttributeReporter:
    pipeline = build_pipeline(*load_raw(REFERENCE_CONFIG.read_text(), str(REFERENCE_CONFIG)),
                              default_registry(entry_points=False))
    [hook] = [p for p in pipeline.response_complete if isinstance(p, RequestAttributeReporter)]
    return hook


@pytest.mark.parametrize(("completion", "reported"), [(5, {"envoy.lb": {"x-gateway-inference-request-cost": 5.0}}),
                                                      (0, None), (None, None)])
def test_reference_config_reports_nonzero_values_only(completion: int | None, reported: dict | None) -> None:
    """The reference skips a zero result (its ResponseBody hook returns before writing), so an answer without
    completion tokens (usage reads 0, ``has()`` still true on the Struct) adds no metadata."""
    resp = info(completion=completion)
    reference_reporter().response_complete(_request(), None, resp)
    assert resp.dynamic_metadata == reported


@pytest.mark.parametrize(("expression", "expected"), [
    ("usage.prompt_tokens - 11.0", None),  # -1: the reference's "not a number" marker, never written
    ("usage.prompt_tokens - 12.0", -2),
    ("0.9", None),  # truncates to 0
    ("-0.5", None),  # truncates to 0 too
    ("double('nan')", -2 ** 63),  # Go's int64(NaN) on amd64, written rather than failing the hook
    ("usage.prompt_tokens / 0.0", -2 ** 63),  # +Inf
    ("1e300", -2 ** 63),  # out of the int64 range
    ("9223372036854775807", -2 ** 63),  # int64 max read through float64 is 2**63: out of range
])
def test_results_are_truncated_as_go_and_zero_or_minus_one_not_reported(expression: str, expected: int | None) -> None:
    hook = reporter(expression)
    assert hook.evaluate(usage_struct(info())) == expected


def _request():  # type: ignore[no-untyped-def]
    from epp.framework.request import parse_request

    return parse_request("/v1/completions", b'{"model": "m", "prompt": "p"}', {})
