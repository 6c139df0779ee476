"""Fixtures for the simulator tests: fast servers on 127.0.0.1, port 0."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from epp_sim import SimConfig, SimServer

from ..conftest import Servers
from .kv_subscriber import Subscriber

# Wall seconds per simulated second: a 10 ms engine step takes ~20 us.
FAST = 0.002


@pytest.fixture
def make_config() -> Callable[..., SimConfig]:
    """SimConfig factory with a fast time scale."""

    def make(**fields: Any) -> SimConfig:
        fields.setdefault("time_scale", FAST)
        return SimConfig(**fields)

    return make


@pytest.fixture
def start_server(servers: Servers) -> Callable[..., Awaitable[SimServer]]:
    """Start servers from SimConfig fields; all are stopped at teardown."""

    async def start(**fields: Any) -> SimServer:
        fields.setdefault("time_scale", FAST)
        return await servers.start(SimServer(SimConfig(**fields)), "127.0.0.1", 0)

    return start


@pytest.fixture
async def sim_server(start_server: Callable[..., Awaitable[SimServer]]) -> SimServer:
    """One default fast server."""
    return await start_server()


@pytest.fixture
def subscriber() -> Iterator[Subscriber]:
    sub = Subscriber()
    try:
        yield sub
    finally:
        sub.close()
