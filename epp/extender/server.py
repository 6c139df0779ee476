"""The kube-scheduler extender's HTTP service: ``POST /filter`` and ``POST /prioritize`` on its own port.

Each call reads the pool's live endpoints at that moment and asks the :class:`~epp.extender.placement.NodePlacer`.
How kube-scheduler reacts decides the answers: it reads only a 200's body, and fails the extender's call on any
other status and on a filter result's ``Error`` (an ``ignorable`` extender is then skipped, else the pod's
scheduling fails). So a body that is not ``ExtenderArgs`` gets 400 (413 above :data:`MAX_BODY`), while a filter
that cannot be answered (the pool not synced yet, a failing detector) gets 200 with ``Error``, the one way its
message reaches the scheduler's log; ``/prioritize`` has no error field and answers 503 or 500. Error bodies are
``{"Error": message}`` either way. Nothing a request sends stops the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web

from epp.errors import EppError, ErrorCode, InternalError, PayloadTooLarge
from epp.extender.api import ExtenderArgs, error_result, filter_result, parse_args, priority_list
from epp.extender.placement import NodePlacer
from epp.framework.endpoint import Endpoint
from epp.framework.pool import EndpointPool

__all__ = ["ExtenderServer", "make_extender_app", "MAX_BODY", "FILTER_PATH", "PRIORITIZE_PATH", "PoolNotSynced"]

log = logging.getLogger(__name__)

MAX_BODY = 4 * 1024 * 1024
"""Largest ``ExtenderArgs`` body, in bytes: far above what node names need; the NodeList form (whole Node objects,
``nodeCacheCapable: false``) reaches it much sooner."""
FILTER_PATH = "/filter"
PRIORITIZE_PATH = "/prioritize"


class PoolNotSynced(EppError):
    """The pool's endpoints are not known yet (discovery has not finished its first sync): 503."""

    code = ErrorCode.SERVICE_UNAVAILABLE


def make_extender_app(placer: NodePlacer, pool: EndpointPool, ready: Callable[[], bool]) -> web.Application:
    """The aiohttp app answering ``/filter`` and ``/prioritize`` from ``pool`` once ``ready()``."""
    handlers = _Handlers(placer, pool, ready)
    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post(FILTER_PATH, handlers.filter)
    app.router.add_post(PRIORITIZE_PATH, handlers.prioritize)
    return app


class _Handlers:
    def __init__(self, placer: NodePlacer, pool: EndpointPool, ready: Callable[[], bool]) -> None:
        self.placer, self.pool, self.ready = placer, pool, ready

    async def filter(self, request: web.Request) -> web.Response:
        """``ExtenderArgs`` -> ``ExtenderFilterResult``."""
        try:
            args = await self._args(request)
        except EppError as exc:
            return _json(error_result(exc.message), exc.status)
        try:
            passed, failed = self.placer.filter(args.pod, args.nodes, self._endpoints())
        except Exception as exc:  # the scheduler gets the reason; the server keeps serving
            return _json(error_result(_failure(exc, FILTER_PATH).message), 200)
        if failed:
            log.debug("extender: pod %s: nodes filtered out: %s", _pod_name(args), ", ".join(failed))
        return _json(filter_result(args, passed, failed), 200)

    async def prioritize(self, request: web.Request) -> web.Response:
        """``ExtenderArgs`` -> ``HostPriorityList``."""
        try:
            args = await self._args(request)
            scores = self._prioritize(args)
        except EppError as exc:
            return _json(error_result(exc.message), exc.status)
        return _json(priority_list(scores), 200)

    def _prioritize(self, args: ExtenderArgs) -> list[tuple[str, int]]:
        try:
            return self.placer.prioritize(args.pod, args.nodes, self._endpoints())
        except EppError:
            raise
        except Exception as exc:
            raise _failure(exc, PRIORITIZE_PATH) from exc

    @staticmethod
    async def _args(request: web.Request) -> ExtenderArgs:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise PayloadTooLarge(f"ExtenderArgs: the body is larger than {MAX_BODY} bytes") from None
        try:
            return parse_args(body)
        except EppError as exc:
            log.warning("extender: %s %s: %s", request.method, request.path, exc.message)
            raise

    def _endpoints(self) -> list[Endpoint]:
        # Unsynced, the pool looks empty: every node would look idle, which is the one thing not to claim.
        if not self.ready():
            raise PoolNotSynced("EPP has not synced its pool's endpoints yet; no placement advice")
        return self.pool.endpoints()


def _failure(exc: Exception, path: str) -> EppError:
    """``exc`` as the error answered: an EppError as is, anything else logged with its traceback (500)."""
    if isinstance(exc, EppError):
        return exc
    log.exception("extender: %s failed", path)
    return InternalError(f"EPP's scheduler extender failed: {type(exc).__name__}: {exc}")


def _pod_name(args: ExtenderArgs) -> str:
    meta = args.pod.get("metadata")
    if not isinstance(meta, dict):
        return "?"
    return f"{meta.get('namespace', '')}/{meta.get('name', '?')}"


def _json(body: bytes, status: int) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


class ExtenderServer:
    """Serves :func:`make_extender_app` on ``host:port`` (port 0 picks a free one: see :attr:`port` after start)."""

    def __init__(self, placer: NodePlacer, pool: EndpointPool, ready: Callable[[], bool], *,
                 host: str = "0.0.0.0", port: int = 9010) -> None:
        self.host, self.port = host, port
        self._runner = web.AppRunner(make_extender_app(placer, pool, ready), access_log=None)

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            raise
        self.port = next((a[1] for a in self._runner.addresses if isinstance(a, tuple)), self.port)

    async def stop(self) -> None:
        """Stop listening; idempotent."""
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"
