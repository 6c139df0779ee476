"""The TTFT floor: what a request's time to first token would be on a server that already holds every cacheable
prefix of it and has nothing else to do, from the simulator's time model.

A request's *cacheable prefix* is the longest run of full KV blocks it shares with any earlier request of the
schedule (an unbounded prefix cache, in send order), capped at ``prompt - 1`` tokens as vLLM's lookup is. The rest
is prefilled alone, in chunks of at most ``max_num_batched_tokens``; each chunk is one engine step (``Engine._duration``
in ``bench/sim/engine.py``)::

    step = step_overhead_s + prefill_s_per_token * n + prefill_attn_s_per_pair * n * (computed + (n + 1) / 2)

and the first token comes out of the last chunk's step. No router can beat this floor for a request; the gap to it
is queueing and cache misses.
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson
import xxhash

from bench.routing.workloads import Request
from epp_sim import ByteTokenizer, SimConfig, TimeModel, Tokenizer, apply_chat_template

__all__ = ["cacheable_prefixes", "prefill_seconds", "prompt_ids", "request_floors"]

_TOKENIZER = ByteTokenizer()


def prefill_seconds(tm: TimeModel, prompt: int, cached: int, budget: int) -> float:
    """Time to first token of a lone ``prompt``-token request of which ``cached`` tokens are cached, with
    ``budget`` tokens per step (chunked prefill)."""
    computed, total = cached, 0.0
    while computed < prompt:
        n = min(prompt - computed, budget)
        total += (tm.step_overhead_s + tm.prefill_s_per_token * n
                  + tm.prefill_attn_s_per_pair * n * (computed + (n + 1) / 2))
        computed += n
    return total


def prompt_ids(request: Request, tokenizer: Tokenizer = _TOKENIZER) -> bytes:
    """The request's prompt as the simulator tokenizes it (uint32 token ids in machine order), as bytes."""
    body = orjson.loads(request.body)
    text = apply_chat_template(body["messages"]) if "messages" in body else body["prompt"]
    return tokenizer.encode(text).tobytes()


def cacheable_prefixes(prompts: Iterable[bytes], block_size: int) -> list[tuple[int, int]]:
    """(prompt tokens, cacheable prefix tokens) of each prompt, given as token-id bytes in send order."""
    seen: set[int] = set()
    width = 4 * block_size  # bytes of one block of token ids
    out = []
    for ids in prompts:
        tokens = len(ids) // 4
        chain, hits, matching = 0, 0, True
        for b in range(tokens // block_size):
            chain = xxhash.xxh3_64_intdigest(chain.to_bytes(8, "little") + ids[b * width:(b + 1) * width])
            if matching and chain in seen:
                hits += 1
            else:
                matching = False
                seen.add(chain)
        out.append((tokens, min(hits, (tokens - 1) // block_size) * block_size))
    return out


def request_floors(requests: list[Request], cfg: SimConfig | None = None,
                   tokenizer: Tokenizer = _TOKENIZER) -> list[float]:
    """Each request's TTFT floor in seconds, on servers configured as ``cfg`` (default: the simulator's defaults)
    that tokenize with ``tokenizer``."""
    cfg = cfg or SimConfig()
    ordered = sorted(requests, key=lambda r: r.offset)
    pairs = cacheable_prefixes((prompt_ids(r, tokenizer) for r in ordered), cfg.block_size)
    return [prefill_seconds(cfg.time_model, prompt, cached, cfg.max_num_batched_tokens) for prompt, cached in pairs]
