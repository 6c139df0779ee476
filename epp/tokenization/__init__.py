"""Prompt token ids computed in EPP's own process (a model's Hugging Face tokenizer and chat template), for the
prefix-cache index without a render call per request: :mod:`.local`, :mod:`.chat_template`."""

from epp.tokenization.chat_template import ChatTemplate, RenderError, TemplateError, content_format
from epp.tokenization.local import LocalTokenizer, TokenizerLoadError

__all__ = ["ChatTemplate", "LocalTokenizer", "RenderError", "TemplateError", "TokenizerLoadError", "content_format"]
