"""context-length-aware: label parsing, the length estimate, the score tiers, the optional filter, the loader."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.framework.plugins import Handle
from epp.framework.request import InferenceRequest, parse_request
from epp.plugins.scorers.context_length_aware import ContextLengthAware, context_length, parse_range, range_score

from .helpers import cycle, ep, make, names, registry, req

LABEL = "llm-d.ai/context-length-range"


def _chat(messages: list[Any]) -> InferenceRequest:
    return parse_request("/v1/chat/completions", orjson.dumps({"model": "m", "messages": messages}), {})


@pytest.mark.parametrize("text,expected", [
    ("0-2048", (0, 2048)),
    ("2048-8192", (2048, 8192)),
    (" 10 - 20 ", (10, 20)),
    ("+5-+7", (5, 7)),
    ("7-7", (7, 7)),
    ("\u00a01-2\u3000", (1, 2)),
    ("", None),
    ("2048", None),
    ("0-2048,2048-8192", None),
    ("-5-10", None),
    ("10-5", None),
    ("a-5", None),
    ("1_000-2000", None),
    ("0-99999999999999999999", None),
    ("\u0661-\u0662", None),
], ids=["zero-based", "upper", "spaces", "plus-signs", "degenerate", "unicode-space", "empty", "one-number",
        "several-ranges", "negative", "min-over-max", "not-a-number", "underscore", "overflow", "arabic-digits"])
def test_parse_range_is_go_atoi_on_one_dash(text: str, expected: tuple[int, int] | None) -> None:
    assert parse_range(text) == expected


@pytest.mark.parametrize("length,lo,hi,expected", [
    (100, 0, 2048, 0.3 + 0.7 * (0.7 / 1.2048 + 0.3 * 1948 / 2048)),
    (2048, 0, 2048, 0.3 + 0.7 * (0.7 / 1.2048)),
    (0, 0, 2048, 0.3 + 0.7 * (0.7 / 1.2048 + 0.3)),
    (500, 500, 500, 1.0),
    (100, 2048, 8192, 0.3 / (1 + 1948 / 1000)),
    (9192, 2048, 8192, 0.3 / 2),
], ids=["in-range", "at-max-no-headroom", "at-min", "degenerate", "below", "above"])
def test_range_score_tiers(length: int, lo: int, hi: int, expected: float) -> None:
    assert range_score(length, lo, hi) == pytest.approx(expected)


def test_in_range_always_beats_out_of_range() -> None:
    assert range_score(10**6, 0, 10**6) > 0.3 > range_score(10**6 + 1, 0, 10**6)


@pytest.mark.parametrize("request_,expected", [
    (_chat([{"role": "user", "content": "a" * 40}, {"role": "assistant", "content": "b" * 3}]), 10),
    (_chat([{"role": "user", "content": [{"type": "text", "text": "a" * 400}]}]), 0),
    (_chat([{"role": "user", "content": "é" * 6}]), 3),
    (_chat([{"role": "user"}, "not-a-message"]), 0),
    (req("x" * 41), 10),
    (parse_request("/v1/completions", orjson.dumps({"model": "m", "prompt": ["x" * 400]}), {}), 0),
    (parse_request("/v1/embeddings", orjson.dumps({"model": "m", "input": "x" * 400}), {}), 0),
], ids=["chat-string-contents", "chat-parts-count-zero", "utf8-bytes", "chat-odd-shapes", "completions",
        "completions-list-prompt", "other-api"])
def test_context_length_estimate(request_: InferenceRequest, expected: int) -> None:
    assert context_length(request_) == expected


POOL = [ep("short", labels={LABEL: "0-2048"}), ep("long", labels={LABEL: "2048-8192"}), ep("any"),
        ep("broken", labels={LABEL: "0-2048,2048-8192"})]


def test_scores_by_label() -> None:
    scores = make(ContextLengthAware).score(cycle(), req("x" * 400), POOL)        # L = 100
    assert scores == pytest.approx([range_score(100, 0, 2048), range_score(100, 2048, 8192), 0.5, 0.0])


@pytest.mark.parametrize("raw,prompt_chars,expected", [
    ({}, 400, ["short", "long", "any", "broken"]),
    ({"enableFiltering": True}, 400, ["short", "any"]),
    ({"enableFiltering": True}, 4 * 3000, ["long", "any"]),
    ({"enableFiltering": True}, 4 * 9000, ["any"]),
    ({"enableFiltering": True, "label": "tier"}, 400, ["short", "long", "any", "broken"]),
], ids=["filtering-off-passes-all", "short-request", "long-request", "longer-than-every-range", "other-label"])
def test_filter(raw: dict, prompt_chars: int, expected: list[str]) -> None:
    flt = make(ContextLengthAware, raw)
    assert names(flt.filter(cycle(), req("x" * prompt_chars), POOL)) == expected


def test_bad_label_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    scorer = make(ContextLengthAware, name="cla")
    with caplog.at_level(logging.WARNING, logger="epp.plugins.context_length_aware"):
        for _ in range(3):
            scorer.score(cycle(), req(), POOL)
    assert [r.getMessage() for r in caplog.records] == [
        f"cla: endpoint label {LABEL}='0-2048,2048-8192' is not a 'min-max' range"]


@pytest.mark.parametrize("raw,field", [({"label": ""}, "label"), ({"enableFiltering": "maybe"}, "enableFiltering"),
                                       ({"ranges": ["0-10"]}, "ranges")], ids=["empty-label", "bad-bool", "unknown"])
def test_bad_params(raw: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        registry().create("context-length-aware", "cla", raw, Handle())
    assert info.value.plugin == "cla" and info.value.field == field


CONFIG = """apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: context-length-aware
  parameters:
    label: llm-d.ai/context-length-range
    enableFiltering: FILTERING
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: context-length-aware
    weight: 2
  - pluginRef: max-score-picker
"""


@pytest.mark.parametrize("filtering", ["true", "false"])
def test_loaded_from_yaml_routes_by_length(filtering: str) -> None:
    pipeline = build_pipeline(*load_raw(CONFIG.replace("FILTERING", filtering), "<cla>"), registry())
    profile = pipeline.scheduler.profiles["default"]
    assert [f.name for f in profile.filters] == ["context-length-aware"]
    assert [(w.scorer.name, w.weight) for w in profile.scorers] == [("context-length-aware", 2.0)]
    for chars, target in ((400, "short"), (4 * 5000, "long")):
        assert pipeline.scheduler.schedule(req("x" * chars), POOL[:3]).target.name == target
