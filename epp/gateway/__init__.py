"""EPP as an OpenAI-compatible HTTP gateway: the same Director as ext_proc, with its own HTTP front end.

Build the app with :func:`make_gateway_app` and serve it with :class:`GatewayServer`::

    director = Director(load_config(path, default_registry()), datastore)
    app = make_gateway_app(director, upstream_timeout=300)
    async with GatewayServer(app, "0.0.0.0", 8080) as server:
        ...

and run the whole program on uvloop when it is installed with :func:`run` (or ``asyncio.Runner`` with
:func:`loop_factory`).
"""

from epp.gateway._app import (
                   CATALOG_KEY,
                   DEFAULT_BODY_LIMIT,
                   DIRECTOR_KEY,
                   INFERENCE_PATHS,
                   PROXY_KEY,
                   SESSION_KEY,
                   make_gateway_app,
                   set_draining,
)
from epp.gateway._models import ModelCatalog
from epp.gateway._proxy import CLIENT_GONE, Proxy, ProxySettings
from epp.gateway._server import GatewayServer, loop_factory, run, uvloop_available
from epp.gateway._upstream import UpstreamLimits

__all__ = [
    "make_gateway_app", "GatewayServer", "UpstreamLimits", "loop_factory", "run", "uvloop_available",
    "DEFAULT_BODY_LIMIT", "INFERENCE_PATHS", "CLIENT_GONE", "Proxy", "ProxySettings", "ModelCatalog",
    "DIRECTOR_KEY", "PROXY_KEY", "SESSION_KEY", "CATALOG_KEY", "set_draining",
]
