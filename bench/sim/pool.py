"""N simulated servers in one process and one event loop (a benchmark on two cores
cannot afford N processes)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Self

from .config import SimConfig
from .server import SimServer

__all__ = ["SimPool"]


class SimPool:
    """Start and stop several `SimServer`s together.

    `ports` gives each server's port (default 0, any free port)::

        async with SimPool([SimConfig(role="prefill"), SimConfig(role="decode")]) as pool:
            urls = [s.url for s in pool.servers]
    """

    def __init__(
        self,
        configs: Iterable[SimConfig],
        *,
        host: str = "127.0.0.1",
        ports: Iterable[int] | None = None,
    ) -> None:
        self.configs = list(configs)
        self.host = host
        self.ports = list(ports) if ports is not None else [0] * len(self.configs)
        if len(self.ports) != len(self.configs):
            raise ValueError("need one port per server config")
        self.servers: list[SimServer] = []

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    async def start(self) -> None:
        """Start every server; if one fails, stop those already started."""
        try:
            for cfg, port in zip(self.configs, self.ports):
                server = SimServer(cfg)
                await server.start(self.host, port)
                self.servers.append(server)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers), return_exceptions=True)
        self.servers = []

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
