"""Fixtures for the gateway tests (helpers and fakes live in ``helpers``), started through the root ``servers``."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import aiohttp
import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.framework.endpoint import EndpointSpec
from epp.framework.registry import Registry
from epp.gateway import GatewayServer, make_gateway_app
from epp.runtime.builtins import default_registry
from epp.scheduling.director import Director
from epp_sim import SimConfig, SimPool, SimServer

from ..conftest import Servers
from .helpers import Recorder, Stack, StackFactory, Tap, TcpRelay


@pytest.fixture(scope="session")
def registry() -> Registry:
    return default_registry()


@pytest.fixture(params=["lean", "aiohttp"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every gateway test runs twice: on EPP's own HTTP server and upstream client (``lean``), and on aiohttp's
    server and client (``aiohttp``)."""
    return request.param


@pytest.fixture
def stack(registry: Registry, transport: str, servers: Servers) -> StackFactory:
    """``await stack(config_text, specs, synced=True, frontend=None, **make_gateway_app kwargs)`` starts a gateway
    (with the ``transport`` fixture's front end and upstream client unless the test passes its own)."""

    async def start(config: str, specs: list[EndpointSpec], *, synced: bool = True, frontend: str | None = None,
                    **kw: Any) -> Stack:
        kw.setdefault("transport", transport)
        pipeline = build_pipeline(*load_raw(config), registry)
        recorder = Recorder()
        pipeline.response_complete.append(recorder)
        datastore = Datastore()
        datastore.replace_all(specs)
        if synced:
            datastore.mark_synced()
        director = Director(pipeline, datastore)
        server = await servers.start(GatewayServer(make_gateway_app(director, **kw), "127.0.0.1", 0,
                                                   frontend=frontend or transport))
        session = aiohttp.ClientSession()
        servers.defer(session.close)
        return Stack(director, datastore, server, recorder, session)

    return start


@pytest.fixture
def sims(servers: Servers) -> Callable[..., Awaitable[list[SimServer]]]:
    """``await sims(cfg, ...)`` starts simulated servers (stopped at the end of the test)."""

    async def start(*configs: SimConfig) -> list[SimServer]:
        return list((await servers.start(SimPool(configs))).servers)

    return start


@pytest.fixture
def taps(servers: Servers) -> Callable[[SimServer], Awaitable[Tap]]:
    """``await taps(server)`` puts a recording relay in front of ``server``."""

    async def start(server: SimServer) -> Tap:
        return await servers.start(Tap(server.url))

    return start


@pytest.fixture
def relays(servers: Servers) -> Callable[[SimServer], Awaitable[TcpRelay]]:
    """``await relays(server)`` puts a killable TCP relay in front of ``server``."""

    async def start(server: SimServer) -> TcpRelay:
        return await servers.start(TcpRelay(server.port))

    return start
