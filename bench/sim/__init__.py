"""A vLLM-compatible model-server simulator: continuous batching over a paged,
prefix-cached KV cache, OpenAI HTTP API, vLLM /metrics, P/D roles, LoRA and KV events."""

from .config import SimConfig, TimeModel
from .engine import Engine, QueueFull, RequestTooLong, Seq
from .kvevents import KVEventPublisher, decode_batch, encode_batch
from .pool import SimPool
from .server import SimServer
from .tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    apply_chat_template,
    load_tokenizer,
)

__all__ = [
    "ByteTokenizer",
    "Engine",
    "HFTokenizer",
    "KVEventPublisher",
    "QueueFull",
    "RequestTooLong",
    "Seq",
    "SimConfig",
    "SimPool",
    "SimServer",
    "TimeModel",
    "Tokenizer",
    "apply_chat_template",
    "decode_batch",
    "encode_batch",
    "load_tokenizer",
]
