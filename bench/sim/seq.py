"""A request inside the simulated engine (`Seq`), its states, and the errors `Engine.add` raises."""

from __future__ import annotations

from array import array
from typing import Any

__all__ = ["FINISHED", "RUNNING", "TRANSFERRING", "WAITING", "QueueFull", "RequestTooLong", "Seq"]

WAITING, RUNNING, TRANSFERRING, FINISHED = range(4)


class QueueFull(Exception):
    """The waiting queue already holds `max_waiting` requests."""


class RequestTooLong(ValueError):
    """Prompt plus output cannot fit in the KV cache."""


class Seq:
    """One request inside the engine. `num_tokens` = prompt + generated tokens."""

    __slots__ = (
        "req_id", "arrival", "priority", "order", "lora", "extra_key", "salt", "salt_key",
        "all_ids", "num_prompt", "max_output", "stop_reason", "out_start",
        "num_tokens", "num_computed", "num_output", "blocks", "block_hashes",
        "num_cached_blocks", "num_cached_tokens", "status", "sched_n", "sched_step",
        "first_sched", "first_token", "last_token", "finish_time", "finish_reason",
        "num_preemptions", "remote_prefill", "remote_decode", "kv_loaded", "kv_ready_at",
        "held", "pooling", "waiter", "stream",
    )

    def __init__(self, req_id: str, prompt_ids: array, arrival: float) -> None:
        self.req_id = req_id
        self.arrival = arrival
        self.priority = 0
        self.order = 0
        self.lora: str | None = None
        self.extra_key = b""
        self.salt: str | None = None
        self.salt_key = b""
        self.all_ids = prompt_ids
        self.num_prompt = self.num_tokens = len(prompt_ids)
        self.max_output = 0
        self.stop_reason = "length"
        self.out_start = 0
        self.num_computed = 0
        self.num_output = 0
        self.blocks: list[int] = []
        self.block_hashes: list[int] = []
        self.num_cached_blocks = 0
        self.num_cached_tokens = -1
        self.status = WAITING
        self.sched_n = 0
        self.sched_step = -1
        self.first_sched = -1.0
        self.first_token = -1.0
        self.last_token = 0.0
        self.finish_time = -1.0
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        self.remote_prefill = False
        self.remote_decode = False
        self.kv_loaded = False
        self.kv_ready_at = 0.0
        self.held = False
        self.pooling = False
        # Owned by the server: a future resolved at finish, or a streaming TokenSink.
        self.waiter: Any = None
        self.stream = False

    @property
    def finished(self) -> bool:
        return self.status == FINISHED

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens found in the cache at first scheduling (usage.cached_tokens)."""
        return max(self.num_cached_tokens, 0)

    def __repr__(self) -> str:
        return (
            f"Seq({self.req_id!r}, status={self.status}, prompt={self.num_prompt}, "
            f"out={self.num_output}/{self.max_output}, computed={self.num_computed})"
        )
