"""Built-in parsers plugins; `register` adds each class listed in BUILTINS (with its aliases)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .openai import OpenAIParser
from .passthrough import PassthroughParser

if TYPE_CHECKING:
    from epp.registry import Registry

BUILTINS: list[tuple[type, tuple[str, ...]]] = [
    (OpenAIParser, ()),
    (PassthroughParser, ()),
]


def register(registry: Registry) -> None:
    """Register this group's plugin classes."""
    for cls, aliases in BUILTINS:
        registry.register(cls, aliases=aliases)
