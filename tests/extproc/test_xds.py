"""EPP's EDS server (:mod:`epp.envoy.xds`): the SotW protocol against a real grpc.aio client, and a real Envoy whose EDS
cluster follows EPP's datastore, over TLS, across an EPP restart, and as ``epp serve --xds-port`` wires it."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from epp._pb.envoy.config.endpoint.v3 import endpoint_pb2
from epp._pb.envoy.service.discovery.v3 import discovery_pb2
from epp.datalayer.datastore import Datastore
from epp.envoy.bootstrap import POOL_CLUSTER, EnvoyConfigOptions, build_bootstrap
from epp.envoy.xds import CLA_TYPE, EDS_SERVICE, XdsServer
from epp.extproc.tls import self_signed
from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EppApp, ServeOptions

from ..conftest import Servers, eventually
from .envoy_harness import EnvoyProcess

Request = discovery_pb2.DiscoveryRequest
Response = discovery_pb2.DiscoveryResponse


def spec(i: int, address: str = "127.0.0.1") -> EndpointSpec:
    return EndpointSpec(name=f"pod{i}", address=address, port=8000 + i)


def hosts(response: Response) -> dict[str, list[str]]:
    """Each ClusterLoadAssignment in ``response``: cluster name -> ``ip:port`` of its endpoints."""
    out = {}
    for resource in response.resources:
        cla = endpoint_pb2.ClusterLoadAssignment()
        assert resource.type_url == CLA_TYPE and resource.Unpack(cla)
        out[cla.cluster_name] = [f"{e.endpoint.address.socket_address.address}:"
                                 f"{e.endpoint.address.socket_address.port_value}"
                                 for group in cla.endpoints for e in group.lb_endpoints]
    return out


class EdsClient:
    """One ``StreamEndpoints`` call, driven message by message as Envoy drives it."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        method = channel.stream_stream(f"/{EDS_SERVICE}/StreamEndpoints", request_serializer=Request.SerializeToString,
                                       response_deserializer=Response.FromString)
        self.call = method()

    async def ask(self, names: list[str], version: str = "", nonce: str = "", error: str = "") -> None:
        request = Request(type_url=CLA_TYPE, resource_names=names, version_info=version, response_nonce=nonce)
        if error:
            request.error_detail.code, request.error_detail.message = 3, error
        await self.call.write(request)

    async def read(self) -> Response:
        message = await asyncio.wait_for(self.call.read(), 10)
        assert isinstance(message, Response)
        return message


@pytest.fixture
def eds(servers: Servers) -> Callable[[Datastore], Awaitable[EdsClient]]:
    """``await eds(datastore)`` -> a client on a fresh plaintext XdsServer for ``datastore``."""

    async def factory(datastore: Datastore) -> EdsClient:
        server = await servers.start(XdsServer(datastore, host="127.0.0.1", port=0))
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        servers.defer(channel.close)
        return EdsClient(channel)

    return factory


async def test_the_pool_is_sent_and_each_change_pushed_once_acked(eds) -> None:
    store = Datastore()
    store.replace_all([spec(0), spec(1)])
    client = await eds(store)
    await client.ask([POOL_CLUSTER])
    first = await client.read()
    assert first.type_url == CLA_TYPE and hosts(first) == {POOL_CLUSTER: ["127.0.0.1:8000", "127.0.0.1:8001"]}
    await client.ask([POOL_CLUSTER], first.version_info, first.nonce)  # ACK: nothing to send until a change
    store.upsert(spec(2))
    second = await client.read()
    assert hosts(second)[POOL_CLUSTER] == ["127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:8002"]
    assert second.version_info != first.version_info and second.nonce != first.nonce
    await client.ask([POOL_CLUSTER], second.version_info, second.nonce)
    store.remove("pod0")
    assert hosts(await client.read())[POOL_CLUSTER] == ["127.0.0.1:8001", "127.0.0.1:8002"]


async def test_a_nack_is_not_answered_with_the_same_version_and_stale_requests_are_ignored(eds) -> None:
    store = Datastore()
    store.replace_all([spec(0)])
    client = await eds(store)
    await client.ask([POOL_CLUSTER])
    first = await client.read()
    await client.ask(["stale-name"], "", "not-the-last-nonce")  # stale: ignored, names included
    await client.ask([POOL_CLUSTER], "", first.nonce, error="rejected for the test")  # NACK: not sent again
    store.upsert(spec(1))  # a new version is sent: the next message Envoy gets is that one
    second = await client.read()
    assert hosts(second) == {POOL_CLUSTER: ["127.0.0.1:8000", "127.0.0.1:8001"]}
    await client.ask(["other", POOL_CLUSTER], second.version_info, second.nonce)  # new names: answered at once
    third = await client.read()
    assert list(hosts(third)) == ["other", POOL_CLUSTER] and third.version_info == second.version_info


async def test_a_wildcard_request_gets_the_pool_and_host_names_are_left_out(eds, caplog) -> None:
    store = Datastore()
    store.replace_all([spec(0), EndpointSpec(name="dns", address="pod.example", port=8000), spec(1, "::1")])
    client = await eds(store)
    await client.ask([])
    assert hosts(await client.read()) == {POOL_CLUSTER: ["127.0.0.1:8000", "::1:8001"]}
    assert "pod.example:8000" in caplog.text and "only IP addresses" in caplog.text


# -- a real Envoy --------------------------------------------------------------------------------------------

def membership(envoy: EnvoyProcess) -> list[str]:
    """The pool cluster's hosts as Envoy has them (admin ``/clusters``)."""
    with urllib.request.urlopen(envoy.admin_url + "/clusters?format=json", timeout=2) as resp:
        data = json.load(resp)
    cluster = next(c for c in data["cluster_statuses"] if c["name"] == POOL_CLUSTER)
    return sorted(f"{h['address']['socket_address']['address']}:{h['address']['socket_address']['port_value']}"
                  for h in cluster.get("host_statuses", []))


@pytest.mark.envoy
async def test_envoy_follows_the_datastore_over_tls_and_across_an_epp_restart(envoy_bin: Path,
                                                                              tmp_path: Path) -> None:
    store = Datastore()
    store.replace_all([spec(0), spec(1)])
    pair = self_signed(["127.0.0.1"])
    server = XdsServer(store, host="127.0.0.1", port=0, key_pair=pair)
    await server.start()
    port = server.port
    opts = EnvoyConfigOptions(listen="127.0.0.1:0", admin="127.0.0.1:0", lb="override-host",
                              xds=(f"127.0.0.1:{port}",))  # TLS to EPP, as by default
    envoy = EnvoyProcess(envoy_bin, build_bootstrap(opts), tmp_path)
    try:
        await asyncio.to_thread(envoy.start)
        await eventually(lambda: membership(envoy) == ["127.0.0.1:8000", "127.0.0.1:8001"])
        store.upsert(spec(2))
        store.remove("pod0")
        await eventually(lambda: membership(envoy) == ["127.0.0.1:8001", "127.0.0.1:8002"])
        await server.stop()  # EPP goes away: Envoy keeps what it has ...
        store.upsert(spec(3))
        assert membership(envoy) == ["127.0.0.1:8001", "127.0.0.1:8002"]
        server = XdsServer(store, host="127.0.0.1", port=port, key_pair=pair)
        await server.start()  # ... and learns what changed meanwhile once EPP is back
        await eventually(lambda: membership(envoy) == ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"])
    finally:
        envoy.stop()
        await server.stop()


async def test_epp_serve_wiring_serves_the_configured_endpoints() -> None:
    app = EppApp(ServeOptions(host="127.0.0.1", grpc_port=None, health_port=None, metrics_port=None,
                              plaintext=True, xds_port=0, endpoints=[spec(0), spec(1)]))
    await app.start()
    try:
        assert app.xds is not None and app.xds.port > 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.xds.port}") as channel:
            client = EdsClient(channel)
            await client.ask([POOL_CLUSTER])
            assert hosts(await client.read()) == {POOL_CLUSTER: ["127.0.0.1:8000", "127.0.0.1:8001"]}
    finally:
        await app.stop()
    assert app.xds._server is None  # stopped with the app
