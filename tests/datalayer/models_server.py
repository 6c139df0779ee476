"""A real ``/v1/models`` server on 127.0.0.1 whose behaviour tests switch: a model list, an error status, garbage,
or no answer at all; optionally TLS-only (and requiring a client certificate)."""

from __future__ import annotations

import asyncio
import ssl

import orjson
from aiohttp import web


class ModelsServer:
    """Serves ``GET /v1/models``. Modes: ``list`` (200 with ``models`` as OpenAI model cards), ``status``
    (``status`` with a JSON error body), ``garbage`` (200 with a body that is not JSON), ``hang`` (never answers
    within a poll's timeout). ``hits`` counts requests."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.ssl_context = ssl_context
        self.mode = "list"
        self.models: list[dict[str, object]] = []
        self.status = 200
        self.hits = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    def serve(self, *ids: str, parent: str | None = None) -> None:
        """List ``ids`` (each a card with ``parent``)."""
        self.mode = "list"
        self.models = [{"id": i, "object": "model", "created": 1700000000, "owned_by": "test", "root": i,
                        "parent": parent} for i in ids]

    async def _handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.mode == "hang":
            await asyncio.sleep(30)
        if self.mode == "garbage":
            return web.Response(body=b"<html>not a model list</html>", content_type="text/html")
        if self.mode == "status":
            return web.json_response({"error": {"message": "boom"}}, status=self.status)
        return web.Response(body=orjson.dumps({"object": "list", "data": self.models}),
                            content_type="application/json")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.ssl_context)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
