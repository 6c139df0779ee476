"""The extender's HTTP service on a real port: statuses and bodies kube-scheduler gets for good and bad calls."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

import aiohttp
import orjson
import pytest

from epp.datalayer.datastore import Datastore
from epp.extender import ExtenderServer, NodePlacer
from epp.extender.placement import SATURATED_REASON
from epp.extender.server import MAX_BODY
from epp.framework.endpoint import Endpoint, EndpointSpec, Metrics
from epp.framework.plugins import Handle
from epp.plugins.saturation import UtilizationDetector

from ..conftest import Servers

NAMES = b'{"Pod":{"metadata":{"name":"vllm-0","labels":{"app":"vllm"}}},"Nodes":null,"NodeNames":["gpu-a","gpu-b"]}'


class FailingDetector:
    """A detector plugin that raises, as a broken third-party one might."""

    type_name: ClassVar[str] = "failing-detector"
    name = "failing"

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        raise ZeroDivisionError("division by zero")


def pool(synced: bool = True) -> Datastore:
    store = Datastore("pool")
    store.replace_all([EndpointSpec("a1", "10.0.0.1", 8000, labels={"app": "vllm"}, node="gpu-a"),
                       EndpointSpec("b1", "10.0.0.2", 8000, labels={"app": "vllm"}, node="gpu-b")])
    a1, b1 = store.get("a1"), store.get("b1")
    assert a1 is not None and b1 is not None
    a1.metrics = Metrics(waiting=6, update_time=time.monotonic())
    b1.metrics = Metrics(waiting=1, update_time=time.monotonic())
    if synced:
        store.mark_synced()
    return store


def detector() -> UtilizationDetector:
    # a generous staleness threshold: these endpoints are scraped once, by hand
    return UtilizationDetector("u", UtilizationDetector.Params(metricsStalenessThreshold=3600), Handle())


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def post(self, path: str, body: bytes) -> tuple[int, Any]:
        async with self.session.post(self.url + path, data=body,
                                     headers={"Content-Type": "application/json"}) as resp:
            return resp.status, orjson.loads(await resp.read())


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def serve(servers: Servers, session: aiohttp.ClientSession, store: Datastore,
                placer: NodePlacer | None = None) -> Client:
    server = ExtenderServer(placer or NodePlacer(detector()), store, store.synced.is_set, host="127.0.0.1", port=0)
    await servers.start(server)
    return Client(session, server.url)


async def test_filter_and_prioritize(servers: Servers, session: aiohttp.ClientSession) -> None:
    client = await serve(servers, session, pool())
    assert await client.post("/filter", NAMES) == (200, {
        "NodeNames": ["gpu-b"], "FailedNodes": {"gpu-a": SATURATED_REASON}, "FailedAndUnresolvableNodes": {},
        "Error": ""})
    assert await client.post("/prioritize", NAMES) == (200, [{"Host": "gpu-a", "Score": 0},
                                                             {"Host": "gpu-b", "Score": 8}])


@pytest.mark.parametrize("body, words", [
    (b"{not json", "the body is not JSON"),
    (b'{"Pod":{},"NodeNames":"gpu-a"}', "NodeNames must be a list of node names"),
    (b'{"NodeNames":["gpu-a"]}', "Pod must be a v1 Pod object"),
], ids=["not-json", "wrong-shape", "no-pod"])
@pytest.mark.parametrize("path", ["/filter", "/prioritize"])
async def test_bad_input_gets_400_with_the_reason(servers: Servers, session: aiohttp.ClientSession, path: str,
                                                  body: bytes, words: str) -> None:
    client = await serve(servers, session, pool())
    status, answer = await client.post(path, body)
    assert status == 400 and words in answer["Error"]
    assert (await client.post(path, NAMES))[0] == 200  # and the next call is answered


async def test_a_body_over_the_limit_gets_413(servers: Servers, session: aiohttp.ClientSession) -> None:
    client = await serve(servers, session, pool())
    names = orjson.dumps([f"node-{i:07d}" for i in range(MAX_BODY // 14)])  # 15 bytes a name: 7% over
    status, answer = await client.post("/filter", b'{"Pod":{},"NodeNames":' + names + b"}")
    assert status == 413 and f"larger than {MAX_BODY} bytes" in answer["Error"]


async def test_other_methods_and_paths_are_refused(servers: Servers, session: aiohttp.ClientSession) -> None:
    client = await serve(servers, session, pool())
    async with session.get(client.url + "/filter") as resp:
        assert resp.status == 405
    async with session.post(client.url + "/bind", data=NAMES) as resp:
        assert resp.status == 404


async def test_an_unsynced_pool_is_reported_not_taken_for_idle(servers: Servers,
                                                               session: aiohttp.ClientSession) -> None:
    store = pool(synced=False)
    client = await serve(servers, session, store)
    # /filter: 200 with Error, the one way kube-scheduler logs the extender's reason; /prioritize has no error field
    status, answer = await client.post("/filter", NAMES)
    assert status == 200 and "has not synced" in answer["Error"] and "NodeNames" not in answer
    status, answer = await client.post("/prioritize", NAMES)
    assert status == 503 and "has not synced" in answer["Error"]
    store.mark_synced()
    assert (await client.post("/filter", NAMES))[1]["NodeNames"] == ["gpu-b"]


async def test_a_failing_detector_fails_the_call_not_the_server(servers: Servers,
                                                                session: aiohttp.ClientSession) -> None:
    client = await serve(servers, session, pool(), NodePlacer(FailingDetector()))
    status, answer = await client.post("/filter", NAMES)
    assert status == 200 and answer["Error"] == ("EPP's scheduler extender failed: ZeroDivisionError: division by "
                                                 "zero")
    status, answer = await client.post("/prioritize", NAMES)
    assert status == 500 and "ZeroDivisionError" in answer["Error"]
    status, _ = await client.post("/prioritize", b"[]")
    assert status == 400


async def test_stop_is_idempotent(servers: Servers) -> None:
    server = ExtenderServer(NodePlacer(detector()), pool(), lambda: True, host="127.0.0.1", port=0)
    await server.start()
    assert server.port != 0
    await server.stop()
    await server.stop()
