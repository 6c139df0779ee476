"""A model's chat template, rendered as vLLM renders it for ``/v1/chat/completions``.

``ChatTemplate(source, special_tokens)`` compiles a Hugging Face chat template (Jinja) in the environment
transformers gives it: a sandbox (``ImmutableSandboxedEnvironment``, so a template cannot reach Python objects),
``trim_blocks``/``lstrip_blocks``, loop controls, the ``{% generation %}`` tag, the ``tojson`` filter and the
``raise_exception``/``strftime_now`` globals. ``render(body)`` turns an OpenAI chat body into the prompt text: the
messages' content in the template's format (``string``: text parts joined by newlines; ``openai``: a list of text
parts, chosen from the template's source as vLLM does), tool-call arguments parsed from JSON, ``tools``,
``documents``, ``add_generation_prompt`` (default true), ``continue_final_message`` and ``chat_template_kwargs``.
A template that does not compile is a :class:`TemplateError` at load; one that refuses or cannot render a request
is a :class:`RenderError` for that request. Media parts are not rendered (no placeholder tokens without the
model's processor): ``render`` raises :class:`RenderError` for them.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

__all__ = ["ChatTemplate", "RenderError", "TemplateError", "content_format"]

ContentFormat = Literal["string", "openai"]


class TemplateError(ValueError):
    """The chat template cannot be used (syntax error, or jinja2 is missing)."""


class RenderError(ValueError):
    """One request cannot be rendered (the template refused it, or it has parts the template cannot take)."""


def _raise_exception(message: str) -> None:
    raise RenderError(f"the chat template refused the request: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers replaces Jinja's tojson (which HTML-escapes) with plain json.dumps; templates rely on that.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> Any:
    try:
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:
        raise TemplateError("a chat template needs the 'jinja2' package (pip install 'epp[tokenizer]')") from exc

    class GenerationTag(Extension):
        """``{% generation %}…{% endgeneration %}`` marks the assistant's part for training masks; it renders its
        body unchanged, as transformers does when no mask is asked for."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols], undefined=jinja2.Undefined)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def content_format(source: str) -> ContentFormat:
    """``openai`` when the template loops over a message's ``content`` (it takes a list of parts), else
    ``string`` — the question vLLM asks of the template's syntax tree."""
    return _format_of(_environment().parse(source))


def _format_of(tree: Any) -> ContentFormat:
    from jinja2 import nodes

    for loop in tree.find_all(nodes.For):
        it = loop.iter
        if isinstance(it, nodes.Filter):  # `message.content | selectattr(...)` still iterates the content
            it = it.node
        if isinstance(it, nodes.Getattr) and it.attr == "content":
            return "openai"
        if isinstance(it, nodes.Getitem) and isinstance(it.arg, nodes.Const) and it.arg.value == "content":
            return "openai"
    return "string"


class ChatTemplate:
    """A compiled chat template (see the module doc)."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None,
                 fmt: ContentFormat | None = None) -> None:
        env = _environment()  # first: it turns a missing jinja2 into a TemplateError
        import jinja2

        try:
            self._template = env.from_string(source)
            self.format: ContentFormat = fmt or _format_of(env.parse(source))
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"the chat template does not compile: line {exc.lineno}: {exc.message}") from exc
        self._special = dict(special_tokens or {})

    def render(self, body: dict[str, Any]) -> str:
        """The prompt text of a chat body (see the module doc)."""
        import jinja2

        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RenderError("'messages' must be a non-empty list")
        extra = body.get("chat_template_kwargs")
        context: dict[str, Any] = {
            **self._special,
            **(extra if isinstance(extra, dict) else {}),
            "messages": [self._message(m) for m in messages],
            "add_generation_prompt": body.get("add_generation_prompt", True) is not False,
            "continue_final_message": body.get("continue_final_message") is True,
        }
        for key in ("tools", "documents"):
            if isinstance(body.get(key), list):
                context[key] = body[key]
        try:
            return str(self._template.render(**context))
        except RenderError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise RenderError(f"the chat template failed on this request: {type(exc).__name__}: {exc}") from exc

    def _message(self, msg: Any) -> dict[str, Any]:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise RenderError("each message must be an object with a string 'role'")
        out = dict(msg)
        out["content"] = self._content(msg.get("content"))
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            out["tool_calls"] = [_parsed_call(c) for c in calls]
        return out

    def _content(self, content: Any) -> Any:
        if content is None:
            return "" if self.format == "string" else []
        if isinstance(content, str):
            return content if self.format == "string" else [{"type": "text", "text": content}]
        if not isinstance(content, list):
            raise RenderError("message content must be a string or a list of parts")
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "input_text") or not isinstance(part.get("text"), str):
                raise RenderError(f"a {kind or 'non-object'} part is not rendered locally (only text parts are)")
            texts.append(part["text"])
        if self.format == "string":
            return "\n".join(texts)
        return [{"type": "text", "text": t} for t in texts]


def _parsed_call(call: Any) -> Any:
    """A tool call with JSON-string arguments parsed, as vLLM hands them to templates (``arguments | items``)."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    fn = call["function"]
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn = {**fn, "arguments": json.loads(args)}
        except ValueError:
            pass  # vLLM passes unparsable arguments on as the string
    return {**call, "function": fn}
