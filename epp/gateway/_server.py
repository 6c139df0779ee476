"""Running the gateway: a start/stop wrapper around aiohttp's runner, and the event-loop helpers.

The event loop is the caller's choice: :func:`loop_factory` returns uvloop's when it is installed (the ``fast``
extra), and :func:`run` runs a coroutine on it. Nothing here installs a global event-loop policy.

``TCP_NODELAY`` needs no code here: aiohttp sets it on every accepted connection and every upstream connection
(``BaseProtocol.connection_made``), so small SSE chunks are never held back by Nagle's algorithm.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine, TypeVar

from aiohttp import web

__all__ = ["GatewayServer", "loop_factory", "run", "uvloop_available"]

T = TypeVar("T")


def uvloop_available() -> bool:
    """Whether uvloop can be imported."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def loop_factory(prefer_uvloop: bool = True) -> Callable[[], asyncio.AbstractEventLoop]:
    """A new-event-loop function: uvloop's when installed and preferred, else asyncio's default."""
    if prefer_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], *, prefer_uvloop: bool = True, debug: bool | None = None) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` chooses."""
    with asyncio.Runner(loop_factory=loop_factory(prefer_uvloop), debug=debug) as runner:
        return runner.run(main)


class GatewayServer:
    """Serves a gateway app on ``host:port`` (port 0 picks a free port; see :attr:`port` after start).

    The runner cancels a request's handler when its client disconnects (``handler_cancellation``), which is
    what lets a client that goes away while EPP waits for the model server abort the upstream request.
    Use as ``async with GatewayServer(app, port=8080) as server: ...`` or call :meth:`start` / :meth:`stop`.
    """

    def __init__(self, app: web.Application, host: str = "0.0.0.0", port: int = 8080, *,
                 reuse_port: bool = False, backlog: int = 2048, shutdown_timeout: float = 10.0,
                 access_log: bool = False) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.reuse_port = reuse_port
        self.backlog = backlog
        self.shutdown_timeout = shutdown_timeout
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=web.access_logger if access_log
                                     else None, shutdown_timeout=shutdown_timeout)

    async def start(self) -> None:
        """Run the app's start-up hooks and start listening."""
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=self.backlog,
                           reuse_port=self.reuse_port or None)
        await site.start()
        for addr in self._runner.addresses:
            if isinstance(addr, tuple):
                self.port = addr[1]
                break

    async def stop(self) -> None:
        """Stop listening, let in-flight requests finish (up to ``shutdown_timeout``), run clean-up hooks."""
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        """``http://host:port`` (a wildcard host is shown as the loopback address)."""
        host = self.host
        if host in ("0.0.0.0", "", "::"):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    async def __aenter__(self) -> GatewayServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

