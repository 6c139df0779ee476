"""Built-in parsers plugins; `register` adds each class listed in BUILTINS (with its aliases)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .anthropic import AnthropicParser
from .openai import OpenAIParser
from .passthrough import PassthroughParser
from .sglang_grpc import SglangGRPCParser
from .sglang_http import SGLangHTTPParser
from .vertexai import VertexAIParser
from .vllm_grpc import VllmGRPCParser
from .vllm_http import VllmHTTPParser

if TYPE_CHECKING:
    from epp.framework.registry import Registry

BUILTINS: list[tuple[type, tuple[str, ...]]] = [
    (OpenAIParser, ()),
    (PassthroughParser, ()),
    (AnthropicParser, ()),
    (VertexAIParser, ()),
    (VllmHTTPParser, ()),
    (SGLangHTTPParser, ()),
    (VllmGRPCParser, ()),
    (SglangGRPCParser, ()),
]


def register(registry: Registry) -> None:
    """Register this group's plugin classes."""
    for cls, aliases in BUILTINS:
        registry.register(cls, aliases=aliases)
