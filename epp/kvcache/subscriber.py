"""ZMQ SUB sockets that receive model servers' KV-cache events.

Two modes: per endpoint (``discoverPods``, the default: EPP connects to each model server's publisher at
``tcp://<endpoint address>:<socketPort + rank>``) and global (``zmqEndpoint``: EPP binds one socket and the servers
connect to it). Every received message ``[topic, seq, payload]`` goes to ``handler(topic, payload, owner)`` on the
event loop, in arrival order per socket; ``owner`` is the endpoint a per-endpoint socket was opened for (None for
the global one). A handler that raises is logged and the socket keeps reading; a socket that fails is closed and
replaced after ``retry_interval``; messages of another shape are counted and dropped.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable

import zmq
import zmq.asyncio

__all__ = ["KVEventSubscribers", "Handler"]

log = logging.getLogger(__name__)

Handler = Callable[[str, bytes, "str | None"], None]


@dataclass
class _Sub:
    address: str
    bind: bool
    owner: str | None
    task: asyncio.Task[None]


class KVEventSubscribers:
    """The set of running subscriber sockets, keyed by a caller-chosen name (an endpoint's, or ``"global"``)."""

    def __init__(self, handler: Handler, topic_filter: str = "kv@", *, retry_interval: float = 5.0) -> None:
        self._handler = handler
        self._topic = topic_filter.encode()
        self._retry = retry_interval
        self._ctx = zmq.asyncio.Context()
        self._subs: dict[str, _Sub] = {}
        self.malformed = 0
        """Messages that were not three frames with an 8-byte sequence number."""

    def keys(self) -> list[str]:
        return list(self._subs)

    def address(self, key: str) -> str | None:
        """The ZMQ address subscriber ``key`` uses, if it exists."""
        sub = self._subs.get(key)
        return sub.address if sub is not None else None

    def ensure(self, key: str, address: str, *, bind: bool = False, owner: str | None = None) -> None:
        """Run a subscriber ``key`` on ``address`` (connect, or bind when ``bind``); replace one under the same key
        that uses another address. Idempotent. Must be called on the event loop."""
        sub = self._subs.get(key)
        if sub is not None and sub.address == address and sub.bind == bind and not sub.task.done():
            return
        if sub is not None:
            sub.task.cancel()
        task = asyncio.get_running_loop().create_task(self._run(address, bind, owner), name=f"kv-events:{key}")
        self._subs[key] = _Sub(address, bind, owner, task)

    def remove(self, key: str) -> None:
        """Stop subscriber ``key`` (if any); its socket closes as its task ends."""
        sub = self._subs.pop(key, None)
        if sub is not None:
            sub.task.cancel()

    async def close(self) -> None:
        """Stop every subscriber and wait for their sockets to close."""
        subs = list(self._subs.values())
        self._subs.clear()
        for sub in subs:
            sub.task.cancel()
        await asyncio.gather(*(s.task for s in subs), return_exceptions=True)
        self._ctx.term()

    async def _run(self, address: str, bind: bool, owner: str | None) -> None:
        while True:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                try:
                    sock.bind(address) if bind else sock.connect(address)
                except zmq.ZMQError as exc:
                    log.error("KV events: cannot %s %s: %s", "bind" if bind else "connect to", address, exc)
                    await asyncio.sleep(self._retry)
                    continue
                sock.setsockopt(zmq.SUBSCRIBE, self._topic)
                await self._read(sock, owner)
            except zmq.ZMQError as exc:  # the socket broke; a fresh one reconnects (or rebinds)
                log.error("KV events: receiving on %s failed: %s", address, exc)
                await asyncio.sleep(self._retry)
            finally:
                sock.close(linger=0)

    async def _read(self, sock: zmq.asyncio.Socket, owner: str | None) -> None:
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                self.malformed += 1
                continue
            try:
                self._handler(frames[0].decode("utf-8", "replace"), frames[2], owner)
            except Exception:
                log.exception("KV events: handling a message from %s failed", owner or "the global socket")
