"""Fixtures for the ext_proc tests: a real ExtProcServer on port 0 with a real grpc.aio client, and a real
Envoy (subprocess) in front of EPP and a pool of upstreams."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import orjson
import pytest

from epp.datalayer.scraper import ScrapeConfig, Scraper
from epp.envoy.bootstrap import INFERENCE_SUFFIXES, EnvoyConfigOptions, build_bootstrap
from epp.extproc import ExtProcServer
from epp.scheduling.director import Director
from epp_sim import SimConfig, SimServer

from ..conftest import Servers
from .envoy_harness import EnvoyProcess
from .helpers import Client, EchoServer

ServerFactory = Callable[..., Awaitable[tuple[ExtProcServer, Client]]]


@pytest.fixture(params=["native", "grpcio"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every ext_proc test runs on both transports: EPP's own HTTP/2 (the default) and grpc.aio."""
    return str(request.param)


@pytest.fixture
def serve(transport: str, servers: Servers) -> ServerFactory:
    """``await serve(director, **ExtProcServer kwargs)`` -> (started plaintext server, client); stopped after."""

    async def factory(director: Director, **kwargs: object) -> tuple[ExtProcServer, Client]:
        kwargs.setdefault("plaintext", True)
        kwargs.setdefault("health_port", 0)
        kwargs.setdefault("transport", transport)
        server = ExtProcServer(director, host="127.0.0.1", port=0, **kwargs)  # type: ignore[arg-type]
        await server.start()
        servers.defer(lambda: server.stop(0))  # no grace: a test's streams are over or abandoned
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        servers.defer(channel.close)
        return server, Client(channel)

    return factory


# -- a real Envoy in front of EPP and a pool ------------------------------------------------------------------

@dataclass
class Stack:
    """Envoy (subprocess) -> EPP (in this loop) -> upstreams (simulators or echo servers, in this loop)."""

    director: Director
    server: ExtProcServer
    envoy: EnvoyProcess
    session: aiohttp.ClientSession
    server_kwargs: dict[str, Any]
    servers: Servers

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.envoy.port}"

    async def post(self, path: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None
                   ) -> tuple[int, dict[str, str], bytes]:
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        async with self.session.post(self.url + path, data=data,
                                     headers={"content-type": "application/json", **(headers or {})}) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.read()

    async def stop_epp(self) -> None:
        await self.server.stop(0)

    async def start_epp(self) -> None:
        """Start a fresh ExtProcServer on the same port (an EPP restart); stopped with the test's servers."""
        server = ExtProcServer(self.director, host="127.0.0.1", port=self.server.port, health_port=None,
                               **self.server_kwargs)
        await server.start()
        self.servers.defer(lambda: server.stop(0))
        self.server = server


StackFactory = Callable[..., Awaitable[Stack]]


def show_upstream(bootstrap: dict[str, Any]) -> None:
    """Test-only: have Envoy tell the client which upstream served it (``x-served-by``)."""
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
        if "route" in route:
            route["response_headers_to_add"] = [
                {"header": {"key": "x-served-by", "value": "%UPSTREAM_REMOTE_ADDRESS%"}}]


def add_subset_hint(bootstrap: dict[str, Any], subset: list[str] | str) -> None:
    """Test-only: a set_metadata filter before ext_proc, as a gateway would set ``envoy.lb.subset_hint``."""
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"].insert(0, {
        "name": "envoy.filters.http.set_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [{"metadata_namespace": "envoy.lb.subset_hint",
                          "value": {"x-gateway-destination-endpoint-subset": subset}}],
        }})


@pytest.fixture
def stack(envoy_bin: Path, tmp_path: Path, transport: str, servers: Servers) -> StackFactory:
    """``await stack(director, mode=..., **EnvoyConfigOptions/ExtProcServer knobs)`` -> a running Stack;
    ``tweak(bootstrap)`` edits the generated bootstrap before Envoy starts."""
    names = (f"envoy{i}" for i in itertools.count())

    async def factory(director: Director, *, mode: str = "full-duplex", response_mode: str = "streamed",
                      fail_open: bool = False, fallback: tuple[str, ...] = (), plaintext: bool = True,
                      subset: list[str] | str | None = None, body_limit: int = 10 << 20,
                      tweak: Callable[[dict[str, Any]], None] | None = None,
                      suffixes: tuple[str, ...] = INFERENCE_SUFFIXES) -> Stack:
        server_kwargs: dict[str, Any] = {"plaintext": plaintext, "body_limit": body_limit, "transport": transport}
        server = ExtProcServer(director, host="127.0.0.1", port=0, health_port=None, **server_kwargs)
        await server.start()
        servers.defer(lambda: server.stop(0))
        opts = EnvoyConfigOptions(listen="127.0.0.1:0", epp=(f"127.0.0.1:{server.port}",), mode=mode,  # type: ignore[arg-type]
                                  response_mode=response_mode, fail_open=fail_open, fallback=fallback,  # type: ignore[arg-type]
                                  plaintext=plaintext, admin="127.0.0.1:0", body_limit=body_limit, suffixes=suffixes)
        bootstrap = build_bootstrap(opts)
        show_upstream(bootstrap)
        if subset is not None:
            add_subset_hint(bootstrap, subset)
        if tweak is not None:  # a hand edit, as an operator's own Envoy config would differ
            tweak(bootstrap)
        envoy = EnvoyProcess(envoy_bin, bootstrap, tmp_path, name=next(names))
        servers.defer(envoy.stop)
        await asyncio.to_thread(envoy.start)
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        servers.defer(session.close)
        return Stack(director, server, envoy, session, server_kwargs, servers)

    return factory


@pytest.fixture
def sims(servers: Servers) -> Callable[..., Awaitable[list[SimServer]]]:
    """``await sims(n, host=..., **SimConfig)`` -> started simulators (fast time scale); stopped after."""

    async def factory(n: int, host: str = "127.0.0.1", **cfg: object) -> list[SimServer]:
        cfg.setdefault("time_scale", 0.01)
        return [await servers.start(SimServer(SimConfig(model="m", seed=i, **cfg)), host, 0)  # type: ignore[arg-type]
                for i in range(n)]

    return factory


@pytest.fixture
def echoes(servers: Servers) -> Callable[..., Awaitable[list[EchoServer]]]:
    """``await echoes(n, host=...)`` -> started echo servers; stopped after."""

    async def factory(n: int, host: str = "127.0.0.1") -> list[EchoServer]:
        return [await servers.start(EchoServer(host)) for _ in range(n)]

    return factory


@pytest.fixture
def scraped(servers: Servers) -> Callable[..., Awaitable[Scraper]]:
    """``await scraped(director)`` -> a started scraper of the director's datastore; stopped after."""

    async def factory(director: Director) -> Scraper:
        return await servers.start(Scraper(director.datastore, ScrapeConfig(interval=0.05)))

    return factory
