"""``requestHandler.parsers``: the reference's own configs load, a parser list picks a parser per request path as
llm-d-router's ParserRegistry does, and bad references are ConfigErrors naming the field and line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.errors import BadRequest, ConfigError
from epp.framework.registry import Registry
from epp.runtime.builtins import default_registry
from epp.scheduling.parsers import ParserRegistry

FIXTURES = Path(__file__).parents[1] / "fixtures/configs/llmd"


def documents(name: str) -> list[str]:
    """The YAML documents of a fixture file, in order."""
    return (FIXTURES / name).read_text().split("\n---\n")


@pytest.fixture(scope="module")
def registry() -> Registry:
    return default_registry(entry_points=False)


def build(text: str, registry: Registry):  # type: ignore[no-untyped-def]
    return build_pipeline(*load_raw(text, "t.yaml"), registry)


def parser_list(*types: str) -> ParserRegistry:
    """A ParserRegistry over fresh parsers of ``types``, each named by its type."""
    reg, plugins = default_registry(entry_points=False), []
    for t in types:
        plugins.append(reg.create(t, t, None, None))  # type: ignore[arg-type]
    return ParserRegistry(plugins)


# -- the reference's configs ------------------------------------------------------------------------------------

def test_parsers_readme_configs_load(registry: Registry) -> None:
    grpc, http, both = (build(text, registry) for text in documents("router_parsers-readme.yaml"))
    assert (grpc.parser.name, grpc.parser.type_name) == ("vllmgrpcParser", "vllmgrpc-parser")
    assert (http.parser.name, http.parser.type_name) == ("vllmhttpParser", "vllmhttp-parser")
    assert isinstance(both.parser, ParserRegistry)
    assert [p.name for p in both.parser.parsers] == ["openaiParser", "anthropicParser"]
    assert both.parser.resolve("/v1/messages", {}).name == "anthropicParser"
    assert both.parser.resolve("/v1/chat/completions", {}).name == "openaiParser"


def test_loader_testdata_parser_configs(registry: Registry) -> None:
    plain, default, named, two_openai, deprecated, wrong_type, wrong_name = documents(
        "router_loader-testdata_parsers.yaml")
    assert build(plain, registry).parser.name == "openai-parser"
    assert build(default, registry).parser.type_name == "openai-parser"
    assert build(named, registry).parser.name == "openaiParser"
    # a second parser of a type already listed is skipped, as the reference's registry skips it: one parser left
    assert build(two_openai, registry).parser.name == "openai-parser"
    assert build(deprecated, registry).parser.name == "openai-parser"
    with pytest.raises(ConfigError, match=r"requestHandler\.parsers\.0\.pluginRef: cannot use plugin 'maxScore' "
                                          r"\(type: max-score-picker\): it is not a parser") as info:
        build(wrong_type, registry)
    assert info.value.line == 14 and info.value.plugin == "maxScore"
    with pytest.raises(ConfigError, match=r"requestHandler\.parsers\.0\.pluginRef references unknown plugin "
                                          r"'wrongParser'") as info:
        build(wrong_name, registry)
    assert info.value.field == "requestHandler.parsers.0.pluginRef" and info.value.line == 14


# -- how a list picks a parser ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path,chosen", [
    ("/v1/chat/completions", "openai-parser"),
    ("/v1/completions", "openai-parser"),
    ("/openai/v1/embeddings/", "openai-parser"),  # any prefix; one trailing slash ignored
    ("/v1/chat/completions?stream=1", "openai-parser"),  # the query is not part of the path
    ("/v1/messages", "anthropic-parser"),
    ("/v1/messages/count_tokens", "anthropic-parser"),
    ("/inference/v1/generate", "vllmhttp-parser"),  # longer than sglanghttp's "generate"
    ("/generate", "sglanghttp-parser"),
    ("/google.cloud.aiplatform.v1.PredictionService/ChatCompletions", "vertexai-parser"),
    ("/vllm.grpc.engine.VllmEngine/Embed", "vllmgrpc-parser"),
    ("/v1/videos/video-123/content", "passthrough-parser"),  # claimed by none: the fallback
], ids=lambda v: v if "-" in v and "/" not in v else None)
def test_the_longest_claimed_suffix_wins_else_the_fallback(path: str, chosen: str) -> None:
    parsers = parser_list("sglanghttp-parser", "openai-parser", "anthropic-parser", "vllmhttp-parser",
                          "vertexai-parser", "vllmgrpc-parser", "passthrough-parser")
    assert parsers.resolve(path, {}).type_name == chosen


def test_an_unclaimed_path_without_a_fallback_is_the_references_400() -> None:
    parsers = parser_list("openai-parser", "anthropic-parser")
    with pytest.raises(BadRequest, match="^no parser registered matching path suffix for: /v1/models$") as info:
        parsers.resolve("/v1/models", {})
    assert info.value.status == 400


def test_an_empty_path_is_taken_from_the_forwarded_path_headers() -> None:
    parsers = parser_list("openai-parser", "anthropic-parser")
    assert parsers.resolve("", {"x-original-path": "/v1/messages"}).type_name == "anthropic-parser"


class _Claiming:
    """A parser plugin claiming one suffix (the reference's test parser)."""

    def __init__(self, name: str, type_name: str, claim: str) -> None:
        self.name, self.type_name, self.claims = name, type_name, (claim,)

    def parse(self, path: str, body: bytes, headers: dict[str, str]) -> str:
        return self.name


def test_equal_claims_go_to_the_parser_listed_first() -> None:
    """The reference's TestParserRegistryPriority: two parsers claim one suffix; the first listed wins."""
    a, b = _Claiming("a", "type-a", "v1/chat/completions"), _Claiming("b", "type-b", "/v1/chat/completions/")
    assert ParserRegistry([a, b]).parse("/v1/chat/completions", b"", {}) == "a"
    assert ParserRegistry([b, a]).parse("/v1/chat/completions", b"", {}) == "b"


def test_parsers_after_the_fallback_and_repeated_types_are_dropped_with_a_warning(
        registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="epp.scheduling.parsers"):
        pipeline = build("""
plugins:
- {type: openai-parser, name: o1}
- {type: openai-parser, name: o2}
- {type: passthrough-parser, name: p}
- {type: anthropic-parser, name: a}
requestHandler: {parsers: [{pluginRef: o1}, {pluginRef: o2}, {pluginRef: p}, {pluginRef: a}]}
""", registry)
    assert [p.name for p in pipeline.parser.parsers] == ["o1", "p"]
    assert pipeline.parser.resolve("/v1/messages", {}).name == "p"  # 'a' comes after the fallback
    assert "parser 'o2' is skipped: a parser of type openai-parser is already listed" in caplog.text
    assert "parser 'a' is skipped: it is listed after the fallback parser 'p'" in caplog.text


# -- the deprecated top-level field, defaults and auto-created parsers ------------------------------------------

def test_the_list_wins_over_the_deprecated_parser_field(registry: Registry,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="epp.config.wiring"):
        pipeline = build("""
plugins: [{type: passthrough-parser}, {type: anthropic-parser}]
parser: {pluginRef: passthrough-parser}
requestHandler: {parsers: [{pluginRef: anthropic-parser}]}
""", registry)
    assert pipeline.parser.type_name == "anthropic-parser"
    assert "t.yaml:3: the deprecated top-level parser 'passthrough-parser' is ignored" in caplog.text


@pytest.mark.parametrize("section", ["requestHandler: {}", "requestHandler: {parsers: []}", ""])
def test_an_empty_list_falls_back_to_the_deprecated_field(section: str, registry: Registry) -> None:
    pipeline = build(f"plugins: [{{type: passthrough-parser}}]\nparser: {{pluginRef: passthrough-parser}}\n"
                     f"{section}\n", registry)
    assert pipeline.parser.type_name == "passthrough-parser"


def test_a_parser_type_named_by_the_list_is_created_when_not_declared(registry: Registry) -> None:
    """The reference's ensureParsers registers a default plugin for a pluginRef no plugin has."""
    pipeline = build("requestHandler: {parsers: [{pluginRef: vllmgrpc-parser}, {pluginRef: openai-parser}]}\n",
                     registry)
    assert [(p.name, p.type_name) for p in pipeline.parser.parsers] == [
        ("vllmgrpc-parser", "vllmgrpc-parser"), ("openai-parser", "openai-parser")]
    assert pipeline.handle.plugin("vllmgrpc-parser") is pipeline.parser.parsers[0]


def test_a_type_that_is_not_a_parser_is_not_created(registry: Registry) -> None:
    with pytest.raises(ConfigError, match=r"requestHandler\.parsers\.1\.pluginRef: no plugin is named "
                                          r"'queue-scorer', and plugin type 'queue-scorer' is not a parser"):
        build("requestHandler: {parsers: [{pluginRef: openai-parser}, {pluginRef: queue-scorer}]}\n", registry)


@pytest.mark.parametrize("text,field,line", [
    ("requestHandler: {parsers: [{}]}\n", "requestHandler.parsers.0.pluginRef", 1),
    ("requestHandler: {parser: {pluginRef: openai-parser}}\n", "requestHandler.parser", 1),
    ("requestHandler:\n  propagatePriority: true\n", "requestHandler.propagatePriority", 2),
], ids=["missing-pluginRef", "singular-parser", "propagate-priority"])
def test_bad_request_handler_sections_name_the_field(text: str, field: str, line: int,
                                                     registry: Registry) -> None:
    with pytest.raises(ConfigError) as info:
        build(text, registry)
    assert info.value.field == field and info.value.line == line, str(info.value)


def test_check_config_lists_the_parsers_and_their_claims(registry: Registry) -> None:
    text = documents("router_parsers-readme.yaml")[2]
    described = build(text, registry).describe()
    assert ("parsers: openaiParser (openai-parser) [chat/completions, completions, embeddings, responses, "
            in described)
    assert "anthropicParser (anthropic-parser) [messages, messages/count_tokens, messages/render]" in described
