"""A vLLM-compatible model-server simulator: continuous batching over a paged,
prefix-cached KV cache, OpenAI HTTP API, vLLM /metrics, P/D roles, LoRA and KV events."""

from bench.sim.config import SimConfig, TimeModel
from bench.sim.engine import Engine, QueueFull, RequestTooLong, Seq
from bench.sim.kvevents import KVEventPublisher, decode_batch, encode_batch
from bench.sim.pool import SimPool
from bench.sim.server import SimServer
from bench.sim.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
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
    "apply_chat_template",
    "decode_batch",
    "encode_batch",
    "load_tokenizer",
]
