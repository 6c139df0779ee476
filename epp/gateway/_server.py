"""Running the gateway: a start/stop wrapper over either HTTP server (EPP's own or aiohttp's), and the event-loop
helpers.

The event loop is the caller's choice: :func:`loop_factory` returns uvloop's when it is installed (the ``fast``
extra), and :func:`run` runs a coroutine on it. Nothing here installs a global event-loop policy.

``TCP_NODELAY`` is set on every accepted and every upstream connection (by ``_frontend`` and ``_http1``, and by
aiohttp's ``BaseProtocol.connection_made`` for aiohttp's server and client), so small SSE chunks are never held
back by Nagle's algorithm.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine, TypeVar

from aiohttp import web

from epp.gateway._aiohttp_server import GatewaySite
from epp.gateway._app import AIOHTTP_HANDLER_ARGS
from epp.gateway._frontend import ClientLimits, LeanFrontend

__all__ = ["FRONTENDS", "GatewayServer", "loop_factory", "run", "uvloop_available"]

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


FRONTENDS = ("lean", "aiohttp")
"""HTTP servers the gateway can run on: ``lean`` (``_frontend``, EPP's own HTTP/1.1 server, the default) or
aiohttp's."""


class GatewayServer:
    """Serves a gateway app on ``host:port`` (port 0 picks a free port; see :attr:`port` after start).

    ``frontend`` picks the HTTP server: ``"lean"`` (:class:`epp.gateway._frontend.LeanFrontend`) or
    ``"aiohttp"``. Both run the app's start-up and clean-up hooks through aiohttp's ``AppRunner``, close idle
    keep-alive connections after ``keepalive_timeout`` seconds, and cancel a request's handler when its client
    disconnects (aiohttp's ``handler_cancellation``), which is what lets a client that goes away while EPP waits
    for the model server abort the upstream request. ``access_log`` applies to aiohttp's server only. Both answer
    the requests they cannot parse in OpenAI error format (aiohttp's through
    :class:`~epp.gateway._aiohttp_server.GatewaySite`). ``client_limits`` (deadlines and caps on clients:
    :class:`~epp.gateway._frontend.ClientLimits`) apply to the lean server only.
    Use as ``async with GatewayServer(app, port=8080) as server: ...`` or call :meth:`start` / :meth:`stop`.
    """

    def __init__(self, app: web.Application, host: str = "0.0.0.0", port: int = 8080, *,
                 reuse_port: bool = False, backlog: int = 2048, shutdown_timeout: float = 10.0,
                 access_log: bool = False, frontend: str = "lean", keepalive_timeout: float = 75.0,
                 client_limits: ClientLimits | None = None) -> None:
        if frontend not in FRONTENDS:
            raise ValueError(f"unknown gateway front end {frontend!r}; expected one of {', '.join(FRONTENDS)}")
        self.app = app
        self.host = host
        self.port = port
        self.reuse_port = reuse_port
        self.backlog = backlog
        self.shutdown_timeout = shutdown_timeout
        self.frontend = frontend
        self.keepalive_timeout = keepalive_timeout
        self.client_limits = client_limits
        self._handler_args = {**AIOHTTP_HANDLER_ARGS, "keepalive_timeout": keepalive_timeout,
                              "access_log": web.access_logger if access_log else None}
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=shutdown_timeout,
                                     **self._handler_args)
        self._lean: LeanFrontend | None = None

    async def start(self) -> None:
        """Run the app's start-up hooks and start listening."""
        await self._runner.setup()
        if self.frontend == "lean":
            self._lean = LeanFrontend(self.app, keepalive_timeout=self.keepalive_timeout, limits=self.client_limits)
            try:
                self.port = await self._lean.start(self.host, self.port, backlog=self.backlog,
                                                   reuse_port=self.reuse_port)
            except BaseException:
                await self._runner.cleanup()
                raise
            return
        site = GatewaySite(self._runner, self.host, self.port, handler_args=self._handler_args,
                           backlog=self.backlog, reuse_port=self.reuse_port)
        await site.start()
        self.port = site.port

    async def stop(self) -> None:
        """Stop listening, let in-flight requests finish (up to ``shutdown_timeout``), run clean-up hooks."""
        if self._lean is not None:
            await self._lean.stop(self.shutdown_timeout)
            self._lean = None
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

