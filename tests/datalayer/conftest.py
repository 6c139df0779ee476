"""Fixtures for the data-layer tests: real metric pages and real HTTP servers on 127.0.0.1.

Pages:

- ``vllm-metrics-v0-sample.txt``: the real vLLM V0 capture from ``shared/fixtures`` (verbatim copy);
- ``vllm-metrics-v1-dp2.txt``: a vLLM V1 page with two data-parallel engines, written by
  ``python -m bench.scrape --write-v1-page`` (prometheus_client rendering vLLM V1's metric definitions).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import pytest

from epp.datalayer.datastore import Datastore

from ..conftest import Servers
from .fake_kube import FakeKube
from .helpers import MetricsServer
from .k8s_cluster import Cluster

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
async def metrics_server(servers: Servers) -> MetricsServer:
    return await servers.start(MetricsServer())


@pytest.fixture
def make_metrics_server(servers: Servers) -> Callable[[], Awaitable[MetricsServer]]:
    """``await make_metrics_server()`` -> another started MetricsServer; stopped after."""

    async def make() -> MetricsServer:
        return await servers.start(MetricsServer())

    return make


# -- Kubernetes backends ---------------------------------------------------------------------------------------


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests using ``cluster`` run against the fake API server; those marked ``k8s_real`` also run against the
    cluster of ``$KUBECONFIG`` when it is set (same test body, different backend)."""
    if "kube_server" in metafunc.fixturenames:
        backends = ["fake"]
        if metafunc.definition.get_closest_marker("k8s_real") and os.environ.get("KUBECONFIG"):
            backends.append("real")
        metafunc.parametrize("k8s_backend", backends, scope="function")


@pytest.fixture
async def kube_server(k8s_backend: str, servers: Servers) -> FakeKube | None:
    """The fake API server for the ``fake`` backend (None for a real cluster)."""
    if k8s_backend != "fake":
        return None
    return await servers.start(FakeKube(bookmark_interval=0.05))


@pytest.fixture
def fake_kube(kube_server: FakeKube | None) -> FakeKube:
    """The fake API server behind ``cluster`` (fault-injection tests only run on the fake backend)."""
    assert kube_server is not None, "fault-injection tests cannot run against a real cluster"
    return kube_server


@pytest.fixture
async def cluster(kube_server: FakeKube | None, tmp_path: Path) -> AsyncIterator[Cluster]:
    if kube_server is None:
        c = await Cluster.connect(Path(os.environ["KUBECONFIG"]), None)
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await c.custom.list_namespaced_custom_object("inference.networking.k8s.io", "v1", c.namespace,
                                                         "inferencepools")
        except ApiException as exc:
            await c.close()
            if exc.status == 404:
                pytest.skip("the InferencePool v1 CRD is not installed in the KUBECONFIG cluster")
            raise
    else:
        c = await Cluster.connect(kube_server.kubeconfig(tmp_path / "kubeconfig"), kube_server)
    yield c
    await c.close()
