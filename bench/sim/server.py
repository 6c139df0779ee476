"""One simulated vLLM server: a :class:`~.backend.SimBackend` behind its aiohttp application (:mod:`.api`).

:meth:`SimServer.start` listens on host:port (0 = any free port) and then starts the engine driver;
:meth:`SimServer.stop` stops the driver, closes the listener (in-flight requests are cancelled) and releases the
rest. ``async with SimServer(cfg)`` does both.
"""

from __future__ import annotations

from typing import Self

from aiohttp import web

from .api import build_app
from .backend import SimBackend
from .config import SimConfig

__all__ = ["SimServer"]


class SimServer(SimBackend):
    """A vLLM-compatible HTTP server backed by the simulated engine."""

    def __init__(self, cfg: SimConfig) -> None:
        super().__init__(cfg)
        self._runner: web.AppRunner | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on host:port (0 = any free port) and start the engine driver."""
        self._runner = web.AppRunner(
            build_app(self), access_log=None, shutdown_timeout=0.5, handler_cancellation=True
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.start_driver(host, self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop serving; in-flight requests are cancelled."""
        await self.stop_driver()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.release()

    async def __aenter__(self) -> Self:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
