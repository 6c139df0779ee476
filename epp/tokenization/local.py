"""A model's tokenizer in EPP's process: prompt token ids without a call to a model server.

``LocalTokenizer.load(path, chat_template=None, workers=2, cache_tokens=0)`` reads a Hugging Face ``tokenizer.json``
(the file, or the model directory holding it) and, from the same directory, the special tokens the template may
name and the chat template: ``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template`` (a list of
named templates: ``tool_use`` for a body with tools, else ``default``, as transformers chooses); ``chat_template``
overrides both. ``await chat_ids(body)`` renders an OpenAI chat body (:mod:`.chat_template`) and encodes it without
special tokens unless the body asks for them, as vLLM's chat path does; ``await prompt_ids(text,
add_special_tokens)`` is the completions path (special tokens by default). Encoding runs in ``workers`` threads
through ``encode_batch``, which releases the GIL, so a long prompt does not stall the event loop; with
``cache_tokens`` > 0 a prompt without special tokens added is encoded section by section, sections seen before
coming from a cache (:mod:`.segments`). Load failures are :class:`TokenizerLoadError`, per-request ones
:class:`RenderError`.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from epp.tokenization.chat_template import ChatTemplate, RenderError, TemplateError
from epp.tokenization.segments import SegmentCache

__all__ = ["LocalTokenizer", "RenderError", "TokenizerLoadError"]

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class TokenizerLoadError(ValueError):
    """The tokenizer or its chat template cannot be loaded; ``field`` names what was wrong (``tokenizer`` or
    ``chatTemplate``)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class LocalTokenizer:
    """A loaded tokenizer and chat template (see the module doc)."""

    def __init__(self, tokenizer: Any, templates: dict[str, ChatTemplate], workers: int, name: str,
                 cache_tokens: int = 0) -> None:
        self._tok = tokenizer
        self.templates = templates
        self.name = name
        self.sections = SegmentCache(tokenizer, cache_tokens)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="epp-tokenize")

    @classmethod
    def load(cls, path: str, chat_template: str | None = None, workers: int = 2,
             cache_tokens: int = 0) -> LocalTokenizer:
        """Load from ``path`` (see the module doc); raises :class:`TokenizerLoadError`."""
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise TokenizerLoadError("a local tokenizer needs the 'tokenizers' package "
                                     "(pip install 'epp[tokenizer]')", "tokenizer") from exc
        where = Path(path)
        file = where / "tokenizer.json" if where.is_dir() else where
        try:
            tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # the Rust binding raises a bare Exception for every failure
            raise TokenizerLoadError(f"cannot load the tokenizer {file}: {exc}", "tokenizer") from exc
        config = _tokenizer_config(file.parent)
        special = _special_tokens(config)
        templates = {}
        for key, source in _template_sources(file.parent, config, chat_template).items():
            try:
                templates[key] = ChatTemplate(source, special)
            except TemplateError as exc:
                raise TokenizerLoadError(f"{exc} ({key} template)", "chatTemplate" if chat_template else
                                         "tokenizer") from exc
        return cls(tok, templates, workers, str(file), cache_tokens)

    def template_for(self, body: dict[str, Any]) -> ChatTemplate | None:
        """The template a chat body is rendered with: ``tool_use`` when it has tools and there is one."""
        if body.get("tools") and "tool_use" in self.templates:
            return self.templates["tool_use"]
        return self.templates.get("default")

    async def chat_ids(self, body: dict[str, Any]) -> list[int]:
        """Token ids of a chat body as the model server will see them; raises :class:`RenderError`."""
        template = self.template_for(body)
        if template is None:
            raise RenderError(f"{self.name} has no chat template beside it (chat_template.jinja or "
                              f"tokenizer_config.json), so chat requests are not tokenized")
        text = template.render(body)
        return await self._encode(text, body.get("add_special_tokens") is True)

    async def prompt_ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a completions prompt."""
        return await self._encode(text, add_special_tokens)

    async def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if not add_special_tokens:
            ids = await self.sections.encode(text, self._encode_many)
            if ids is not None:
                return ids
        [ids] = await self._encode_many([text], add_special_tokens)
        return ids

    async def _encode_many(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        loop = asyncio.get_running_loop()
        encode = partial(self._tok.encode_batch, texts, add_special_tokens=add_special_tokens)
        encodings = await loop.run_in_executor(self._pool, encode)
        return [e.ids for e in encodings]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _tokenizer_config(folder: Path) -> dict[str, Any]:
    file = folder / "tokenizer_config.json"
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"cannot read {file}: {exc}", "tokenizer") from exc
    return data if isinstance(data, dict) else {}


def _template_sources(folder: Path, config: dict[str, Any], override: str | None) -> dict[str, str]:
    """The chat templates' text by name (``default``, maybe ``tool_use``): the override file, else
    chat_template.jinja, else tokenizer_config.json's."""
    if override is not None:
        try:
            return {"default": Path(override).read_text(encoding="utf-8")}
        except OSError as exc:
            raise TokenizerLoadError(f"cannot read the chat template {override}: {exc}", "chatTemplate") from exc
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return {"default": jinja.read_text(encoding="utf-8")}
    value = config.get("chat_template")
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):
        return {t["name"]: t["template"] for t in value if isinstance(t, dict) and isinstance(t.get("name"), str)
                and isinstance(t.get("template"), str)}
    return {}


def _special_tokens(config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key in _SPECIAL_KEYS:
        value = config.get(key)
        if isinstance(value, dict):  # an AddedToken: {"content": "<s>", ...}
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out
