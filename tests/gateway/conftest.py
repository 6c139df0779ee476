"""Fixtures for the gateway tests (helpers and fakes live in ``gw_helpers``)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from epp_sim import SimConfig, SimPool, SimServer
from epp.config.loader import build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.scheduling.director import Director
from epp.framework.endpoint import EndpointSpec
from epp.gateway import GatewayServer, make_gateway_app
from epp.framework.registry import Registry, default_registry
from gw_helpers import Recorder, Stack, StackFactory, Tap, TcpRelay


@pytest.fixture(scope="session")
def registry() -> Registry:
    return default_registry()


@pytest.fixture(params=["lean", "aiohttp"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every gateway test runs twice: on EPP's own HTTP server and upstream client (``lean``), and on aiohttp's
    server and client (``aiohttp``)."""
    return request.param


@pytest.fixture
async def stack(registry: Registry, transport: str) -> AsyncIterator[StackFactory]:
    """``await stack(config_text, specs, synced=True, frontend=None, **make_gateway_app kwargs)`` starts a gateway
    (with the ``transport`` fixture's front end and upstream client unless the test passes its own)."""
    started: list[Stack] = []

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
        server = GatewayServer(make_gateway_app(director, **kw), "127.0.0.1", 0, frontend=frontend or transport)
        await server.start()
        st = Stack(director, datastore, server, recorder, aiohttp.ClientSession())
        started.append(st)
        return st

    yield start
    for st in started:
        await st.session.close()
        await st.server.stop()


@pytest.fixture
async def sims() -> AsyncIterator[Callable[..., Awaitable[list[SimServer]]]]:
    """``await sims(cfg, ...)`` starts simulated servers (stopped at the end of the test)."""
    pools: list[SimPool] = []

    async def start(*configs: SimConfig) -> list[SimServer]:
        pool = SimPool(configs)
        await pool.start()
        pools.append(pool)
        return list(pool.servers)

    yield start
    for pool in pools:
        await pool.stop()


@pytest.fixture
async def taps() -> AsyncIterator[Callable[[SimServer], Awaitable[Tap]]]:
    """``await taps(server)`` puts a recording relay in front of ``server``."""
    started: list[Tap] = []

    async def start(server: SimServer) -> Tap:
        tap = Tap(server.url)
        await tap.start()
        started.append(tap)
        return tap

    yield start
    for tap in started:
        await tap.stop()




@pytest.fixture
async def relays() -> AsyncIterator[Callable[[SimServer], Awaitable[TcpRelay]]]:
    """``await relays(server)`` puts a killable TCP relay in front of ``server``."""
    started: list[TcpRelay] = []

    async def start(server: SimServer) -> TcpRelay:
        relay = TcpRelay(server.port)
        await relay.start()
        started.append(relay)
        return relay

    yield start
    for relay in started:
        await relay.stop()
