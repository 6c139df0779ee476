"""The TTFT floor: what a request's time to first token would be on a server that already holds every cacheable
prefix of it and has nothing else to do, from the simulator's time model.

A request's *cacheable prefix* is the longest run of full KV blocks it shares with any earlier request of the
schedule (an unbounded prefix cache, in send order), capped at ``prompt - 1`` tokens as vLLM's lookup is. The rest
is prefilled alone, in chunks of at most ``max_num_batched_tokens``; each chunk is one engine step (``Engine._duration``
in ``bench/sim/engine.py``)::

    step = step_overhead_s + prefill_s_per_token * n + prefill_attn_s_per_pair * n * (computed + (n + 1) / 2)

and the first token comes out of the last chunk's step. Its *E2E floor* adds the decode steps of its other
``max_tokens - 1`` tokens alone in the batch, the ``j``-th attending to ``prompt + j`` KV tokens::

    decode step = step_overhead_s + decode_s_per_seq + attn_s_per_kv_token * (prompt + j)

No router can beat either for a request (a batch only adds to a step); the gap to them is queueing, cache misses
and sharing steps. So no router's output throughput can exceed the *ceiling*: the schedule's answer tokens over
the latest ``offset + E2E floor``, the time by which every answer could have ended.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from bench.routing.workloads import Request
from epp_sim import ByteTokenizer, SimConfig, TimeModel, Tokenizer, apply_chat_template

__all__ = ["FLOOR_ROW", "Floor", "cacheable_prefixes", "decode_seconds", "prefill_seconds", "prompt_ids",
           "request_floors", "throughput_ceiling"]

_TOKENIZER = ByteTokenizer()
FLOOR_ROW = "floor (cached prefix, no queue)"
"""The floors' row in a results table: TTFT and E2E of each request alone on a server holding its prefix, and the
throughput ceiling as its output tok/s."""


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


def decode_seconds(tm: TimeModel, prompt: int, output: int) -> float:
    """The decode steps after the first token of a lone ``output``-token answer to a ``prompt``-token request."""
    steps = max(0, output - 1)
    # sum over j < steps of (per-step cost + attention to prompt + j KV tokens), in closed form
    return steps * (tm.step_overhead_s + tm.decode_s_per_seq + tm.attn_s_per_kv_token * prompt) \
        + tm.attn_s_per_kv_token * steps * (steps - 1) / 2


def prompt_ids(request: Request, tokenizer: Tokenizer = _TOKENIZER) -> bytes:
    """The request's prompt as the simulator tokenizes it (uint32 token ids in machine order), as bytes."""
    return _body_ids(orjson.loads(request.body), tokenizer)


def _body_ids(body: dict[str, Any], tokenizer: Tokenizer) -> bytes:
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


@dataclass(frozen=True, slots=True)
class Floor:
    """One request's floors in seconds: sent at ``offset``, first token after ``ttft``, last after ``e2e``, of an
    answer of ``output`` tokens (its ``max_tokens``, which the simulator always fills)."""

    offset: float
    ttft: float
    e2e: float
    output: int


def request_floors(requests: list[Request], cfg: SimConfig | None = None,
                   tokenizer: Tokenizer = _TOKENIZER) -> list[Floor]:
    """Each request's floors, in send order, on servers configured as ``cfg`` (default: the simulator's defaults)
    that tokenize with ``tokenizer``."""
    cfg = cfg or SimConfig()
    tm = cfg.time_model
    ordered = sorted(requests, key=lambda r: r.offset)
    bodies = [orjson.loads(r.body) for r in ordered]
    pairs = cacheable_prefixes((_body_ids(body, tokenizer) for body in bodies), cfg.block_size)
    floors = []
    for request, body, (prompt, cached) in zip(ordered, bodies, pairs):
        ttft = prefill_seconds(tm, prompt, cached, cfg.max_num_batched_tokens)
        output = int(body.get("max_tokens") or 1)
        floors.append(Floor(request.offset, ttft, ttft + decode_seconds(tm, prompt, output), output))
    return floors


def throughput_ceiling(floors: Sequence[Floor]) -> float:
    """The output tokens per second no router can exceed on this schedule (NaN: no request)."""
    end = max((f.offset + f.e2e for f in floors), default=0.0)
    return sum(f.output for f in floors) / end if end > 0 else math.nan
