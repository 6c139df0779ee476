"""A ZMQ SUB socket for the simulator's KV-event tests (the ``subscriber`` fixture in conftest.py)."""

from __future__ import annotations

import zmq
import zmq.asyncio

__all__ = ["Subscriber"]


class Subscriber:
    """A bound SUB socket that simulated servers connect their KV-event publishers to."""

    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"

    async def receive(self, timeout: float = 0.2) -> list[list[bytes]]:
        """Every message that arrives until ``timeout`` seconds pass without one."""
        out = []
        while await self.sock.poll(timeout * 1000):
            out.append(await self.sock.recv_multipart())
            timeout = 0.05
        return out

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()
