"""The routing benchmark's workloads: seeded, open-loop request schedules over a described pool of servers.

``generate(workload, qps, duration, seed)`` returns the :class:`Request` list every router of a run is sent: the same
offsets, paths and body bytes for the same arguments, whatever the router (nothing in a request depends on an answer;
a multi-turn session resends a synthetic assistant reply as long as the answer it asked for). Arrivals are Poisson at
``qps`` over ``[0, duration)``. Every body is a streamed chat completion with ``stream_options.include_usage`` and a
fixed ``max_tokens``, so the simulator's answer lengths do not depend on the server that answers.

Text is synthetic (random lowercase words, no dataset): the simulator's tokenizer makes four UTF-8 bytes one token,
so ``tokens`` tokens of text are ``4 * tokens`` ASCII bytes. ``WORKLOADS`` maps each name to its :class:`Workload`:
the generator, the pool it runs on (``pool(servers)``) and the default QPS sweep for that many servers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["MODEL", "KV_TOKENS_PER_SERVER", "Request", "ServerSpec", "Workload", "WORKLOADS", "generate",
           "zipf_weights"]

MODEL = "sim-llama-8b"
KV_TOKENS_PER_SERVER = 2048 * 16
"""What one simulated server's KV cache holds at the simulator's defaults (2,048 blocks of 16 tokens)."""

CHAT_PATH = "/v1/chat/completions"
_LETTERS = b"abcdefghijklmnopqrstuvwxyz     "  # ~1 space in 6: words of about five letters
_TABLE = bytes(_LETTERS[i % len(_LETTERS)] for i in range(256))


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a schedule: sent ``offset`` seconds after the run starts, to ``path``, with ``body``."""

    index: int
    offset: float
    path: str
    body: bytes
    group: int = -1  # the shared prefix (system prompt, session) it belongs to; -1: none
    kind: str = ""  # the workload's label for requests alike (long/short, turn 1..N); "": one kind


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One simulated server of a workload's pool: its P/D role and how much slower than the default it is."""

    role: str = "both"
    slowdown: float = 1.0


@dataclass(frozen=True)
class Workload:
    """A named workload: ``make(rng, qps, duration, servers)`` builds its requests, ``pool(servers)`` its servers,
    ``qps(servers)`` the default sweep; ``pd``: the pool has prefill and decode roles; ``sessions``: a group's
    requests are the turns of one conversation."""

    name: str
    summary: str
    make: Callable[[random.Random, float, float, int], list[Request]]
    pool: Callable[[int], list[ServerSpec]]
    qps: Callable[[int], list[float]]
    pd: bool = False
    sessions: bool = False


def generate(workload: Workload, qps: float, duration: float, seed: int, servers: int = 4) -> list[Request]:
    """The schedule of ``workload`` at ``qps`` for ``duration`` seconds; the same for the same arguments."""
    rng = random.Random(f"{workload.name}/{seed}/{servers}/{qps:g}/{duration:g}")
    return workload.make(rng, qps, duration, servers)


# ---------------------------------------------------------------------------------------------- building blocks


def text(rng: random.Random, tokens: int) -> str:
    """``tokens`` tokens of random lowercase words (exactly ``4 * tokens`` ASCII bytes)."""
    return rng.randbytes(4 * tokens).translate(_TABLE).decode()


def zipf_weights(n: int, s: float) -> list[float]:
    """Zipf popularity of ``n`` items with exponent ``s``, normalised to sum to 1."""
    raw = [1.0 / (k + 1) ** s for k in range(n)]
    total = sum(raw)
    return [w / total for w in raw]


def arrivals(rng: random.Random, rate: float, duration: float) -> list[float]:
    """Poisson arrival times at ``rate`` per second in ``[0, duration)``."""
    times, t = [], rng.expovariate(rate)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def lognormal_int(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    """A log-normal draw around ``median``, rounded and clipped to ``[low, high]``."""
    return max(low, min(high, round(rng.lognormvariate(math.log(median), sigma))))


def chat_body(messages: list[dict[str, str]], max_tokens: int) -> bytes:
    """A streamed chat completion asking for exactly ``max_tokens`` tokens, with the usage in the last chunk."""
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
    return orjson.dumps(body)


def _numbered(items: list[tuple[float, bytes, int, str]]) -> list[Request]:
    items.sort(key=lambda item: item[0])
    return [Request(i, offset, CHAT_PATH, body, group, kind) for i, (offset, body, group, kind) in enumerate(items)]


def uniform_pool(servers: int) -> list[ServerSpec]:
    return [ServerSpec() for _ in range(servers)]


def _sweep(*per_four: float) -> Callable[[int], list[float]]:
    """A QPS sweep given for 4 servers, scaled to the pool's size."""
    return lambda servers: [round(q * servers / 4, 2) for q in per_four]


# ---------------------------------------------------------------------------------------------- workloads


def shared_prefix(groups: int, system_tokens: int, question_tokens: int, output_tokens: int, *,
                  questions: int = 0, per_server: bool = False,
                  weights: Callable[[int], list[float]] | None = None) -> Callable[..., list[Request]]:
    """llm-d's shared-prefix shape: ``groups`` long system prompts (``per_server``: that many per server), each
    request one of them plus a question: one of the group's ``questions`` (so whole prompts recur, as in llm-d's
    ``num_prompts_per_group``) or, with ``questions=0``, a question of its own. ``weights(n)`` gives the groups'
    popularity (default: uniform)."""

    def make(rng: random.Random, qps: float, duration: float, servers: int) -> list[Request]:
        n = groups * servers if per_server else groups
        systems = [f"group {g}: " + text(rng, system_tokens) for g in range(n)]
        asked = [[text(rng, question_tokens) for _ in range(questions)] for _ in range(n)]
        popularity = weights(n) if weights else [1.0] * n
        items = []
        for t in arrivals(rng, qps, duration):
            g = rng.choices(range(n), popularity)[0]
            question = rng.choice(asked[g]) if questions else text(rng, question_tokens)
            messages = [{"role": "system", "content": systems[g]}, {"role": "user", "content": question}]
            items.append((t, chat_body(messages, output_tokens), g, ""))
        return _numbered(items)

    return make


def multi_turn(turns: int = 5, apps: int = 4, system_tokens: int = 1000) -> Callable[..., list[Request]]:
    """Chat sessions of ``turns`` turns, each resending the whole history; sessions start as a Poisson process at
    ``qps / turns`` and think 1 s + Exp(mean 3 s) between turns. Each session uses one of ``apps`` system prompts."""

    def make(rng: random.Random, qps: float, duration: float, servers: int) -> list[Request]:
        systems = [f"app {a}: " + text(rng, system_tokens) for a in range(apps)]
        items = []
        for session, start in enumerate(arrivals(rng, qps / turns, duration)):
            messages = [{"role": "system", "content": systems[rng.randrange(apps)]}]
            t = start
            for turn in range(1, turns + 1):
                if t >= duration:
                    break
                answer = lognormal_int(rng, 150, 0.6, 16, 512)
                messages.append({"role": "user", "content": text(rng, lognormal_int(rng, 150, 0.6, 16, 1024))})
                items.append((t, chat_body(messages, answer), session, f"turn {turn}"))
                # The next turn resends what the answer would have been as long: open loop, answer-independent.
                messages = messages + [{"role": "assistant", "content": text(rng, answer)}]
                t += 1.0 + rng.expovariate(1 / 3.0)
        return _numbered(items)

    return make


def _sharegpt_like(rng: random.Random) -> tuple[int, int]:
    """(prompt tokens, output tokens) with ShareGPT-like long-tailed lengths (synthetic)."""
    return lognormal_int(rng, 200, 1.0, 8, 6000), lognormal_int(rng, 150, 0.9, 4, 1024)


def random_prompts(long_share: float = 0.0, long_tokens: int = 16000) -> Callable[..., list[Request]]:
    """Unrelated prompts of ShareGPT-like lengths; ``long_share`` of them are ``long_tokens``-token prompts."""

    def make(rng: random.Random, qps: float, duration: float, servers: int) -> list[Request]:
        items = []
        for t in arrivals(rng, qps, duration):
            prompt, output = _sharegpt_like(rng)
            long = rng.random() < long_share
            if long:
                prompt, output = long_tokens, 100
            messages = [{"role": "user", "content": text(rng, prompt)}]
            kind = ("long" if long else "short") if long_share else ""
            items.append((t, chat_body(messages, output), 1 if long else -1, kind))
        return _numbered(items)

    return make


def slow_pool(servers: int) -> list[ServerSpec]:
    """One server in four (at least one, at most two) is 2x slower: every time-model term doubled."""
    slow = min(2, max(1, servers // 4))
    return [ServerSpec(slowdown=2.0 if i < slow else 1.0) for i in range(servers)]


def pd_pool(servers: int) -> list[ServerSpec]:
    """Half prefill servers (at least one), the rest decode servers (at least one)."""
    prefill = max(1, servers // 2)
    return [ServerSpec(role="prefill") for _ in range(prefill)] + [
        ServerSpec(role="decode") for _ in range(max(1, servers - prefill))]


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("shared-prefix", "llm-d's shape: 16 groups x 5,750-token system prompts, each with 5 recurring "
             "1,150-token questions (about 6,900 tokens a prompt; system prompts 70% of a 4-server pool's KV, whole "
             "prompts 140%), 100 output tokens",
             shared_prefix(16, 5750, 1150, 100, questions=5), uniform_pool, _sweep(10, 20)),
    Workload("multi-turn", "sessions of 5 turns resending their history (4 app system prompts of 1,000 tokens, "
             "turns of ~150 tokens, answers of ~150 tokens)", multi_turn(), uniform_pool, _sweep(20, 30),
             sessions=True),
    Workload("random", "unrelated prompts, ShareGPT-like lengths (log-normal: prompt median 200, output median "
             "150 tokens)", random_prompts(), uniform_pool, _sweep(14, 28)),
    Workload("cache-pressure", "12 groups per server x 4,000-token system prompts, uniform (prefix demand 1.46x "
             "all servers' KV together) + 400-token questions, 100 output tokens",
             shared_prefix(12, 4000, 400, 100, per_server=True), uniform_pool, _sweep(10, 20)),
    Workload("hot-prefix", "8 groups x 3,000-token system prompts, Zipf 1.5 popularity (the hottest is 52% of "
             "the traffic, 2x one server's share) + 500-token questions, 150 output tokens",
             shared_prefix(8, 3000, 500, 150, weights=lambda n: zipf_weights(n, 1.5)), uniform_pool,
             _sweep(20, 30)),
    Workload("heterogeneous", "8 groups x 2,000-token system prompts + 500-token questions, 128 output tokens, "
             "on a pool where 1 server in 4 is 2x slower", shared_prefix(8, 2000, 500, 128), slow_pool,
             _sweep(20, 30)),
    Workload("long-short", "ShareGPT-like short chats with 10% unique 16,000-token prompts (100 output tokens)",
             random_prompts(0.10), uniform_pool, _sweep(6, 10)),
    Workload("pd", "8 groups x 2,000-token system prompts + 1,000-token questions, 100 output tokens, on a "
             "prefill/decode pool (half each)", shared_prefix(8, 2000, 1000, 100), pd_pool, _sweep(5, 10),
             pd=True),
]}
"""Every workload by name, in the order the benchmark runs them."""
