"""Which prompts a simulated server served, for benchmarks that need to see where each request went.

A router between the load generator and the servers may re-serialise the body and carries no request id, so a
request is known by :func:`prompt_key`, a digest of what it asks (each message's role and content, or the prompt),
which the sender computes from its own body alike. :class:`Served` keeps the keys in arrival order, at most
``limit`` (the oldest dropped), and ``GET /sim/served`` returns them.
"""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Any

import orjson

__all__ = ["Served", "prompt_key", "SERVED_LIMIT"]

SERVED_LIMIT = 200_000
"""Keys kept per server: a 60 s benchmark run sends a few thousand requests, so this bounds only a long-lived one."""


def prompt_key(body: dict[str, Any]) -> str | None:
    """A 16-hex-digit digest of the request's messages (role and content, any JSON content canonicalised) or prompt;
    None for a body with neither."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = [orjson.dumps([m.get("role"), m.get("content")], option=orjson.OPT_SORT_KEYS)
                 if isinstance(m, dict) else orjson.dumps(m) for m in messages]
        data = b"\n".join(parts)
    elif "prompt" in body:
        data = orjson.dumps(body["prompt"])
    else:
        return None
    return hashlib.blake2b(data, digest_size=8).hexdigest()


class Served:
    """The keys of the requests a server accepted, oldest first, bounded."""

    def __init__(self, limit: int = SERVED_LIMIT) -> None:
        self.keys: deque[str] = deque(maxlen=limit)

    def record(self, body: dict[str, Any]) -> None:
        key = prompt_key(body)
        if key is not None:
            self.keys.append(key)
