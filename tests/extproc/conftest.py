"""Fixtures for the ext_proc tests: a real ExtProcServer on port 0 with a real grpc.aio client."""

from __future__ import annotations

from typing import AsyncIterator, Awaitable, Callable

import grpc
import pytest
from extproc_helpers import Client

from epp.director import Director
from epp.extproc import ExtProcServer

ServerFactory = Callable[..., Awaitable[tuple[ExtProcServer, Client]]]


@pytest.fixture
async def serve() -> AsyncIterator[ServerFactory]:
    """``await serve(director, **ExtProcServer kwargs)`` -> (started plaintext server, client); stopped after."""
    started: list[tuple[ExtProcServer, grpc.aio.Channel]] = []

    async def factory(director: Director, **kwargs: object) -> tuple[ExtProcServer, Client]:
        kwargs.setdefault("plaintext", True)
        kwargs.setdefault("health_port", 0)
        server = ExtProcServer(director, host="127.0.0.1", port=0, **kwargs)  # type: ignore[arg-type]
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        started.append((server, channel))
        return server, Client(channel)

    yield factory
    for server, channel in started:
        await channel.close()
        await server.stop(0)
