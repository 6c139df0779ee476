"""``token-producer``'s local backend: the ids it computes in process are the ones a real simulator (with the same
tokenizer.json) answers on vLLM's render routes; the chat template runs in transformers' environment (sandbox,
trim/lstrip, loop controls, ``generation``, ``tojson``, ``raise_exception``), in the content format its source asks
for; failures leave the ids unset; bad files are config errors naming plugin, field and line."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from bench.routing.tokenizer import CHAT_TEMPLATE, build
from bench.routing.workloads import text
from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.framework.plugins import Handle
from epp.framework.request import InferenceRequest, parse_request
from epp.plugins.producers.token_producer import TokenProducer
from epp.tokenization import ChatTemplate, LocalTokenizer, RenderError, content_format
from epp.tokenization.segments import VERIFY_EVERY, VERIFY_FIRST
from epp_sim import SimConfig, SimServer, apply_chat_template

from ..conftest import Servers
from .helpers import registry

MODEL = "sim-model"
HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
SEGMENT_PROMPTS = VERIFY_FIRST + VERIFY_EVERY + 8
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The benchmark's tokenizer folder (tokenizer.json and the simulator's chat template), small vocabulary."""
    return build(tmp_path_factory.mktemp("tok"), vocab=1024)


@pytest.fixture
async def sim(folder: Path) -> AsyncIterator[SimServer]:
    server = SimServer(SimConfig(model=MODEL, time_scale=0.002, tokenizer=str(folder / "tokenizer.json")))
    await server.start("127.0.0.1", 0)
    yield server
    await server.stop()


async def _producer(servers: Servers, local: dict[str, Any]) -> TokenProducer:
    p = registry().create("token-producer", "tp", {"local": local}, Handle())
    return await servers.start(p, None)


def _request(path: str, body: dict[str, Any]) -> InferenceRequest:
    return parse_request(path, orjson.dumps(body), {})


async def _render_ids(sim: SimServer, path: str, body: dict[str, Any]) -> list[int]:
    async with aiohttp.ClientSession() as session:
        async with session.post(sim.url + path, json=body) as resp:
            assert resp.status == 200, await resp.text()
            data = await resp.json()
    return list((data[0] if isinstance(data, list) else data)["token_ids"])


def _chats() -> list[dict[str, Any]]:
    rng = random.Random(7)
    return [
        {"messages": [{"role": "user", "content": "hello there"}]},
        {"messages": [{"role": "system", "content": text(rng, 600)}, {"role": "user", "content": text(rng, 40)}]},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one"},
                      {"role": "assistant", "content": text(rng, 30)}, {"role": "user", "content": "two words"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one "},
                                                   {"type": "text", "text": text(rng, 20)}]}]},
        {"messages": [{"role": "user", "content": "ünïcødé — and <|user|> inside text"}]},
    ]


@pytest.mark.parametrize("index", range(5))
async def test_chat_ids_are_the_simulators_render_ids(sim: SimServer, servers: Servers, folder: Path,
                                                      index: int) -> None:
    body = {"model": MODEL, **_chats()[index]}
    producer = await _producer(servers, {"tokenizer": str(folder)})
    request = _request("/v1/chat/completions", body)
    await producer.prepare(request)
    assert request.token_ids == await _render_ids(sim, "/v1/chat/completions/render", body)
    assert producer.successes == 1 and producer.failures == 0


async def test_completion_ids_are_the_simulators_render_ids(sim: SimServer, servers: Servers, folder: Path) -> None:
    body = {"model": MODEL, "prompt": text(random.Random(3), 300)}
    producer = await _producer(servers, {"tokenizer": str(folder / "tokenizer.json")})
    request = _request("/v1/completions", body)
    await producer.prepare(request)
    assert request.token_ids == await _render_ids(sim, "/v1/completions/render", body)


def test_the_benchmarks_template_renders_what_the_simulator_renders() -> None:
    template = ChatTemplate(CHAT_TEMPLATE)
    for body in _chats():
        assert template.render(body) == apply_chat_template(body["messages"])


async def test_media_requests_are_left_without_ids_and_without_a_failure(servers: Servers, folder: Path) -> None:
    producer = await _producer(servers, {"tokenizer": str(folder)})
    request = _request("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]})
    await producer.prepare(request)
    assert request.token_ids is None and producer.failures == 0


async def test_a_template_that_refuses_the_request_leaves_no_ids(servers: Servers, folder: Path,
                                                                tmp_path: Path) -> None:
    strict = tmp_path / "strict.jinja"
    strict.write_text("{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
                      + CHAT_TEMPLATE)
    producer = await _producer(servers, {"tokenizer": str(folder), "chatTemplate": str(strict)})
    refused = _request("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    await producer.prepare(refused)
    accepted = _request("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "system", "content": "s"}]})
    await producer.prepare(accepted)
    assert refused.token_ids is None and accepted.token_ids and producer.failures == 1


async def test_without_a_chat_template_chat_requests_get_no_ids(servers: Servers, folder: Path,
                                                                tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    producer = await _producer(servers, {"tokenizer": str(tmp_path)})
    chat = _request("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    completion = _request("/v1/completions", {"model": MODEL, "prompt": "hi there"})
    await producer.prepare(chat)
    await producer.prepare(completion)
    assert chat.token_ids is None and completion.token_ids and producer.failures == 1


# ------------------------------------------------------------------ the chat template's environment


def _render(source: str, body: dict[str, Any], special: dict[str, str] | None = None) -> str:
    return ChatTemplate(source, special).render(body)


USER = {"messages": [{"role": "user", "content": "hi"}]}


def test_blocks_trim_their_newline_and_leading_space_as_transformers_sets_them() -> None:
    source = "{% for m in messages %}\n    {% if true %}\n[{{ m['content'] }}]\n    {% endif %}\n{% endfor %}"
    assert _render(source, USER) == "[hi]\n"


def test_loop_controls_and_the_generation_tag_compile() -> None:
    source = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
              "{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}")
    body = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    assert _render(source, body) == "a"


def test_tojson_is_plain_json_not_html_escaped() -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "<é>", "n": 1}]}
    assert _render("{{ tools | tojson }}", body) == json.dumps(body["tools"], ensure_ascii=False)
    indented = json.dumps(body["tools"][0], indent=2, ensure_ascii=False)
    assert _render("{{ tools[0] | tojson(indent=2) }}", body) == indented


def test_special_tokens_generation_prompt_and_template_kwargs_reach_the_template() -> None:
    source = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
              "{% if add_generation_prompt %}>{% endif %}{% if enable_thinking is defined %}T{% endif %}")
    assert _render(source, USER, {"bos_token": "<s>"}) == "<s>hi>"
    assert _render(source, {**USER, "add_generation_prompt": False, "chat_template_kwargs":
                            {"enable_thinking": False}}, {"bos_token": "<s>"}) == "<s>hiT"


def test_the_sandbox_refuses_python_internals() -> None:
    with pytest.raises(RenderError):
        _render("{{ messages.__class__.__mro__[1].__subclasses__() }}", USER)
    with pytest.raises(RenderError):
        _render("{{ messages.append(1) }}", USER)


def test_raise_exception_is_a_render_error_with_the_templates_message() -> None:
    with pytest.raises(RenderError, match="roles must alternate"):
        _render("{{ raise_exception('roles must alternate') }}", USER)


def test_strftime_now_is_available() -> None:
    assert len(_render("{{ strftime_now('%Y') }}", USER)) == 4


@pytest.mark.parametrize("source, fmt", [
    (CHATML, "string"),
    (CHAT_TEMPLATE, "openai"),
    ("{% for m in messages %}{% for p in m.content | selectattr('type', 'equalto', 'text') %}{{ p.text }}"
     "{% endfor %}{% endfor %}", "openai"),
])
def test_the_content_format_is_read_from_the_templates_loops(source: str, fmt: str) -> None:
    assert content_format(source) == fmt


def test_string_format_joins_text_parts_with_newlines_as_vllm_does() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert _render(CHATML, body, None) == "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"


def test_tool_call_arguments_reach_the_template_as_objects() -> None:
    source = ("{% for m in messages %}{% for c in m.tool_calls or [] %}{% for k, v in c.function.arguments | items %}"
              "{{ k }}={{ v }};{% endfor %}{% endfor %}{% endfor %}")
    body = {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"city": "Oslo", "days": 2}'}}]}]}
    assert _render(source, body) == "city=Oslo;days=2;"


# ------------------------------------------------------------------ loading


def test_the_template_and_special_tokens_come_from_tokenizer_config(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<B>", "lstrip": False}, "eos_token": "<E>",
        "chat_template": [{"name": "tool_use", "template": "tools"},
                          {"name": "default",
                           "template": "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}"}]}))
    loaded = LocalTokenizer.load(str(tmp_path))
    try:
        plain, with_tools = loaded.template_for(USER), loaded.template_for({**USER, "tools": [{"type": "function"}]})
        assert plain is not None and plain.render(USER) == "<B>hi<E>"
        assert with_tools is not None and with_tools.render(USER) == "tools"
    finally:
        loaded.close()


def _config_error(local: str) -> ConfigError:
    text = HEAD + f"plugins:\n- type: token-producer\n  parameters:\n    local: {local}\n"
    with pytest.raises(ConfigError) as info:
        build_pipeline(*load_raw(text, "<t>"), registry())
    return info.value


def test_a_missing_tokenizer_is_a_config_error_naming_plugin_field_and_line(tmp_path: Path) -> None:
    error = _config_error(f"{{tokenizer: {tmp_path / 'nowhere'}}}")
    assert (error.plugin, error.field, error.line) == ("token-producer", "local.tokenizer", 6)  # the `local:` line
    assert "nowhere" in str(error)


def test_a_template_that_does_not_compile_is_a_config_error(folder: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content }")
    error = _config_error(f"{{tokenizer: {folder}, chatTemplate: {bad}}}")
    assert error.field == "local.chatTemplate" and "line 2" in str(error)


@pytest.mark.parametrize("params, field", [
    ("{tokenizer: ''}", "tokenizer"),
    ("{tokenizer: x, workers: 0}", "workers"),
    ("{tokenizer: x, cacheDir: y}", "cacheDir"),
])
def test_bad_local_parameters_are_config_errors(params: str, field: str) -> None:
    error = _config_error(params)
    assert error.plugin == "token-producer" and error.field is not None and field in error.field


def test_local_and_vllm_together_are_refused(folder: Path) -> None:
    text = HEAD + ("plugins:\n- type: token-producer\n  parameters:\n    modelName: m\n"
                   f"    local: {{tokenizer: {folder}}}\n    vllm: {{http: 'http://127.0.0.1:1'}}\n")
    with pytest.raises(ConfigError) as info:
        build_pipeline(*load_raw(text, "<t>"), registry())
    assert info.value.field == "local"


# ------------------------------------------------------------------ the section cache


def _whole(folder: Path, text_: str) -> list[int]:
    from tokenizers import Tokenizer

    return list(Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text_, add_special_tokens=False).ids)


def _conversations(n: int) -> list[dict[str, Any]]:
    rng = random.Random(11)
    systems = [text(rng, 500) for _ in range(3)]
    return [{"messages": [{"role": "system", "content": systems[i % 3]},
                          {"role": "user", "content": text(rng, 30)}]} for i in range(n)]


async def test_sections_seen_before_come_from_the_cache_and_the_ids_stay_exact(folder: Path) -> None:
    local = LocalTokenizer.load(str(folder), cache_tokens=100_000)
    try:
        bodies = _conversations(SEGMENT_PROMPTS)  # past the verified first prompts, into the unverified ones
        for body in bodies:
            template = local.template_for(body)
            assert template is not None
            assert await local.chat_ids(body) == _whole(folder, template.render(body))
        cache = local.sections
        assert cache.enabled and cache.mismatches == 0
        assert cache.hits >= len(bodies) - 3  # every system prompt after its first time (and the role lines)
    finally:
        local.close()


async def test_the_cache_holds_at_most_its_token_budget_and_survives_evictions_mid_request(folder: Path) -> None:
    import asyncio

    local = LocalTokenizer.load(str(folder), cache_tokens=800)  # about one system prompt
    try:
        bodies = _conversations(24)
        results = await asyncio.gather(*(local.chat_ids(b) for b in bodies))
        for body, ids in zip(bodies, results):
            template = local.template_for(body)
            assert template is not None and ids == _whole(folder, template.render(body))
        assert 0 < local.sections.tokens <= 800
    finally:
        local.close()


def _metaspace_first(tmp_path: Path) -> Path:
    """A SentencePiece-style tokenizer that puts "▁" before the input's first word only: its sections do not encode
    alone as they do inside the whole text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.decoder = decoders.Metaspace(prepend_scheme="first")
    rng = random.Random(2)
    tok.train_from_iterator([text(rng, 200) for _ in range(50)], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<|user|>", "<|system|>", "<|assistant|>"], show_progress=False))
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return tmp_path


async def test_a_tokenizer_that_does_not_split_at_added_tokens_turns_the_cache_off(tmp_path: Path) -> None:
    folder = _metaspace_first(tmp_path)
    local = LocalTokenizer.load(str(folder), cache_tokens=100_000)
    try:
        for body in _conversations(5):
            template = local.template_for(body)
            assert template is not None
            assert await local.chat_ids(body) == _whole(folder, template.render(body))
        assert local.sections.mismatches == 1 and not local.sections.enabled and local.sections.tokens == 0
    finally:
        local.close()


def test_added_tokens_that_strip_whitespace_keep_the_cache_off(folder: Path, tmp_path: Path) -> None:
    data = json.loads((folder / "tokenizer.json").read_text())
    data["added_tokens"][0]["rstrip"] = True
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    local = LocalTokenizer.load(str(tmp_path), cache_tokens=100_000)
    try:
        assert not local.sections.enabled
    finally:
        local.close()


async def test_truncate_prompt_tokens_keeps_the_last_tokens_as_vllm_does(servers: Servers, folder: Path) -> None:
    producer = await _producer(servers, {"tokenizer": str(folder)})
    body = {"model": MODEL, "messages": [{"role": "user", "content": text(random.Random(4), 100)}]}
    whole, cut = _request("/v1/chat/completions", body), _request("/v1/chat/completions",
                                                                   {**body, "truncate_prompt_tokens": 20})
    await producer.prepare(whole)
    await producer.prepare(cut)
    assert whole.token_ids is not None and len(whole.token_ids) > 20 and cut.token_ids == whole.token_ids[-20:]


def test_without_jinja2_a_chat_template_is_a_config_error_saying_what_to_install(
        folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "jinja2", None)  # `import jinja2` raises ImportError
    error = _config_error(f"{{tokenizer: {folder}}}")
    assert error.field == "local.tokenizer" and "pip install 'epp[tokenizer]'" in str(error)


async def test_an_encoder_failure_leaves_no_ids_and_does_not_raise(servers: Servers, folder: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    producer = await _producer(servers, {"tokenizer": str(folder)})
    local = producer._local
    assert local is not None

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise Exception("the binding's bare exception")

    monkeypatch.setattr(local, "_tok", type("Broken", (), {"encode_batch": staticmethod(broken)})())
    request = _request("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    await producer.prepare(request)
    assert request.token_ids is None and producer.failures == 1
