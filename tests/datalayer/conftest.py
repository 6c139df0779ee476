"""Fixtures for the data-layer tests: real metric pages and real HTTP servers on 127.0.0.1.

Pages:

- ``vllm-metrics-v0-sample.txt``: the real vLLM V0 capture from ``shared/fixtures`` (verbatim copy);
- ``vllm-metrics-v1-dp2.txt``: a vLLM V1 page with two data-parallel engines, written by
  ``python -m bench.scrape --write-v1-page`` (prometheus_client rendering vLLM V1's metric definitions).
"""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import pytest
from datalayer_helpers import MetricsServer

from epp.datastore import Datastore

HERE = Path(__file__).parent


@pytest.fixture
def v0_page() -> bytes:
    return (HERE / "vllm-metrics-v0-sample.txt").read_bytes()


@pytest.fixture
def v1_page() -> bytes:
    return (HERE / "vllm-metrics-v1-dp2.txt").read_bytes()


@pytest.fixture
def datastore() -> Datastore:
    return Datastore("test-pool")


@pytest.fixture
async def metrics_server() -> AsyncIterator[MetricsServer]:
    server = MetricsServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def make_metrics_server() -> AsyncIterator[Callable[[], Awaitable[MetricsServer]]]:
    servers: list[MetricsServer] = []

    async def make() -> MetricsServer:
        server = MetricsServer()
        await server.start()
        servers.append(server)
        return server

    yield make
    for s in servers:
        await s.stop()
