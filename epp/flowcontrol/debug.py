"""``GET /debug/tenants``: each tenant's quota, in-flight and queue, as JSON (mounted on the metrics port)."""

from __future__ import annotations

from typing import Awaitable, Callable

import orjson
from aiohttp import web

from epp.flowcontrol.base import AdmissionController

__all__ = ["debug_tenants_handler", "DEBUG_TENANTS_PATH"]

DEBUG_TENANTS_PATH = "/debug/tenants"


def debug_tenants_handler(controller: AdmissionController) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler serving ``controller.snapshot()``; mount it with
    ``app.router.add_get(DEBUG_TENANTS_PATH, debug_tenants_handler(controller))``."""

    async def handler(request: web.Request) -> web.Response:
        body = orjson.dumps(controller.snapshot(), option=orjson.OPT_NON_STR_KEYS)
        return web.Response(body=body, content_type="application/json")

    return handler
