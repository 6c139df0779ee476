"""Kubernetes discovery through the real ``kubernetes_asyncio`` client.

Tests marked ``k8s_real`` only use the Kubernetes API (through :class:`k8s_cluster.Cluster`) and also run against
a real cluster when ``KUBECONFIG`` is set. The others inject API-server faults the fake offers on purpose
(410 Gone, cut streams, server-side timeouts, an API server that is down or restarts).
"""

from __future__ import annotations

from typing import Awaitable, Callable

import pytest

from epp.datalayer.datastore import Datastore
from epp.datalayer.kubernetes import (
    KubernetesDiscovery,
    PoolSpec,
    WatchOptions,
    discovery_from_options,
    parse_selector,
    pod_endpoints,
)
from epp.errors import ConfigError
from epp.runtime.ports import free_ports

from ..conftest import Servers, eventually
from .fake_kube import FakeKube

FAST = WatchOptions(watch_timeout=5.0, read_margin=5.0, request_timeout=5.0, backoff_initial=0.02,
                    backoff_max=0.2)
APP = {"app": "vllm"}


def names(ds: Datastore) -> list[str]:
    return sorted(ep.name for ep in ds.endpoints())


def where(ds: Datastore) -> dict[str, str]:
    return {ep.name: ep.hostport for ep in ds.endpoints()}


@pytest.fixture
def discover(datastore, cluster, servers: Servers) -> Callable[..., Awaitable[KubernetesDiscovery]]:
    """Start a discovery for this test's cluster; stopped at teardown."""

    async def start(**kw) -> KubernetesDiscovery:
        kw.setdefault("pool_name", "pool")
        return await servers.start(KubernetesDiscovery(datastore, namespace=cluster.namespace,
                                                       kubeconfig=cluster.kubeconfig, options=FAST, **kw))

    return start


# -- behaviour against any API server --------------------------------------------------------------------------


@pytest.mark.k8s_real
async def test_initial_sync_ranks_and_readiness(cluster, datastore, discover):
    await cluster.create_pool("pool", APP, [8000, 8001])
    await cluster.create_pod("a", {**APP, "llm-d.ai/role": "decode"}, "10.1.0.1")
    await cluster.create_pod("b", APP, "10.1.0.2", ready=False)
    await cluster.create_pod("other", {"app": "other"}, "10.1.0.3")
    await discover()
    await eventually(lambda: datastore.synced.is_set(), what="synced")
    assert where(datastore) == {"a-rank-0": "10.1.0.1:8000", "a-rank-1": "10.1.0.1:8001"}
    a0 = datastore.get("a-rank-0")
    assert a0.labels["llm-d.ai/role"] == "decode" and a0.spec.metrics_port == 8000
    assert a0.spec.namespace == cluster.namespace                # session-affinity tokens carry it

    await cluster.set_ready("b", True)
    await eventually(lambda: names(datastore) == ["a-rank-0", "a-rank-1", "b-rank-0", "b-rank-1"],
                     what="b became Ready")
    await cluster.set_ready("a", False)
    await eventually(lambda: names(datastore) == ["b-rank-0", "b-rank-1"], what="a became NotReady")
    await cluster.set_ready("a", True)
    await eventually(lambda: len(datastore.endpoints()) == 4, what="a Ready again")


@pytest.mark.k8s_real
async def test_deletion_and_termination(cluster, datastore, discover):
    await cluster.create_pool("pool", APP, [8000])
    for i, name in enumerate(["a", "b", "c"]):
        await cluster.create_pod(name, APP, f"10.2.0.{i + 1}")
    await discover()
    await eventually(lambda: names(datastore) == ["a-rank-0", "b-rank-0", "c-rank-0"], what="three pods")
    keep = datastore.get("c-rank-0")
    keep.add_inflight(10)

    await cluster.delete_pod("a")  # forced: gone at once
    await eventually(lambda: names(datastore) == ["b-rank-0", "c-rank-0"], what="a deleted")
    await cluster.delete_pod("b", grace=None)  # graceful: terminating (deletionTimestamp) but still listed
    await eventually(lambda: names(datastore) == ["c-rank-0"], what="terminating b dropped")
    assert datastore.get("c-rank-0") is keep and keep.inflight_requests == 1


@pytest.mark.k8s_real
async def test_target_port_changes_take_effect_live(cluster, datastore, discover):
    await cluster.create_pool("pool", APP, [8000, 8001])
    await cluster.create_pod("a", APP, "10.3.0.1")
    await discover()
    await eventually(lambda: names(datastore) == ["a-rank-0", "a-rank-1"], what="two ranks")
    rank0 = datastore.get("a-rank-0")

    await cluster.update_pool("pool", ports=[8000])
    await eventually(lambda: names(datastore) == ["a-rank-0"], what="rank 1 removed")
    assert datastore.get("a-rank-0") is rank0  # unchanged endpoint keeps its identity

    await cluster.update_pool("pool", ports=[9000, 8000, 8002])
    await eventually(lambda: where(datastore) == {"a-rank-0": "10.3.0.1:9000", "a-rank-1": "10.3.0.1:8000",
                                                  "a-rank-2": "10.3.0.1:8002"}, what="ranks follow port order")


@pytest.mark.k8s_real
async def test_reordered_target_ports_keep_every_endpoint_findable_by_address(cluster, datastore, discover):
    await cluster.create_pool("pool", APP, [8000, 8001])
    await cluster.create_pod("a", APP, "10.3.1.1")
    await discover()
    await eventually(lambda: names(datastore) == ["a-rank-0", "a-rank-1"], what="two ranks")
    await cluster.update_pool("pool", ports=[8001, 8000])
    await eventually(lambda: where(datastore) == {"a-rank-0": "10.3.1.1:8001", "a-rank-1": "10.3.1.1:8000"},
                     what="ranks swapped ports")
    for ep in datastore.endpoints():
        assert datastore.by_hostport(ep.hostport) is ep


@pytest.mark.k8s_real
async def test_active_ports_annotation(cluster, datastore, discover):
    await cluster.create_pool("pool", APP, [8000, 8001, 8002])
    await cluster.create_pod("a", APP, "10.4.0.1",
                             annotations={"inference.networking.k8s.io/active-ports": "8001, 9999,x"})
    await discover()
    await eventually(lambda: where(datastore) == {"a-rank-1": "10.4.0.1:8001"}, what="only the active port")
    await cluster.patch_pod_metadata("a", annotations={"inference.networking.k8s.io/active-ports": "8000,8002"})
    await eventually(lambda: names(datastore) == ["a-rank-0", "a-rank-2"], what="annotation changed")
    await cluster.patch_pod_metadata("a", annotations={"inference.networking.k8s.io/active-ports": None})
    await eventually(lambda: names(datastore) == ["a-rank-0", "a-rank-1", "a-rank-2"], what="annotation removed")


@pytest.mark.k8s_real
async def test_selector_changes_and_relabelled_pods(cluster, datastore, discover):
    await cluster.create_pool("pool", APP, [8000])
    await cluster.create_pod("a", APP, "10.5.0.1")
    await cluster.create_pod("b", {"app": "sglang"}, "10.5.0.2")
    await discover()
    await eventually(lambda: names(datastore) == ["a-rank-0"], what="selector app=vllm")

    await cluster.update_pool("pool", selector={"app": "sglang"})
    await eventually(lambda: names(datastore) == ["b-rank-0"], what="selector app=sglang")

    await cluster.patch_pod_metadata("a", labels={"app": "sglang"})  # a starts matching
    await eventually(lambda: names(datastore) == ["a-rank-0", "b-rank-0"], what="a relabelled in")
    await cluster.patch_pod_metadata("b", labels={"app": None})  # b stops matching
    await eventually(lambda: names(datastore) == ["a-rank-0"], what="b relabelled out")


@pytest.mark.k8s_real
async def test_pool_missing_deleted_and_recreated(cluster, datastore, discover):
    await cluster.create_pod("a", APP, "10.6.0.1")
    await discover()
    await eventually(lambda: cluster.fake is None or cluster.fake.requests[("watch", "inferencepools")] > 0,
                     what="pool watch open")
    assert not datastore.synced.is_set()  # no pool: not ready, like the reference

    await cluster.create_pool("pool", APP, [8000])
    await eventually(lambda: datastore.synced.is_set() and names(datastore) == ["a-rank-0"], what="pool came")
    await cluster.delete_pool("pool")
    await eventually(lambda: names(datastore) == [] and not datastore.synced.is_set(),
                     what="pool deleted: no endpoints, not ready (the reference's PoolHasSynced)")
    await cluster.create_pool("pool", APP, [8001])
    await eventually(lambda: where(datastore) == {"a-rank-0": "10.6.0.1:8001"} and datastore.synced.is_set(),
                     what="pool recreated: ready again")


@pytest.mark.k8s_real
async def test_selector_only_mode_needs_no_pool(cluster, datastore, discover):
    await cluster.create_pod("a", APP, "10.7.0.1")
    await cluster.create_pod("b", {"app": "other"}, "10.7.0.2")
    await discover(pool_name=None, selector=APP, target_ports=[8000, 8001])
    await eventually(lambda: datastore.synced.is_set(), what="synced without a pool")
    assert names(datastore) == ["a-rank-0", "a-rank-1"]
    await cluster.create_pod("c", APP, "10.7.0.3")
    await eventually(lambda: len(datastore.endpoints()) == 4, what="new pod found")


# -- API-server faults (fake only) -----------------------------------------------------------------------------


async def test_410_gone_relists_as_error_event_and_as_http_status(cluster, datastore, discover, fake_kube):
    await cluster.create_pool("pool", APP, [8000])
    await cluster.create_pod("a", APP, "10.8.0.1")
    await cluster.create_pod("b", APP, "10.8.0.2")
    d = await discover()
    await eventually(lambda: names(datastore) == ["a-rank-0", "b-rank-0"], what="initial")
    b = datastore.get("b-rank-0")
    for as_http in (False, True):
        fake_kube.gone_as_http = as_http
        await fake_kube.stop()  # changes happen while EPP cannot see them...
        fake_kube.delete("pods", "default", "a", grace=0)
        fake_kube.create("pods", "default", {"metadata": {"name": f"c{int(as_http)}", "labels": APP},
                                             "spec": {"containers": [{"name": "s", "image": "i"}]}})
        fake_kube.patch("pods", "default", f"c{int(as_http)}", {"status": {
            "podIP": f"10.8.1.{int(as_http)}", "conditions": [{"type": "Ready", "status": "True"}]}},
            subresource="status")
        fake_kube.compact()  # ...and the history that would have told it is gone
        relists = d.relists
        await fake_kube.start()
        await eventually(lambda: d.relists > relists, what="410 led to a re-list")
        expected = ["b-rank-0"] + [f"c{i}-rank-0" for i in range(int(as_http) + 1)]
        await eventually(lambda: names(datastore) == expected, what="state after re-list")
        if not as_http:
            fake_kube.create("pods", "default", {"metadata": {"name": "a", "labels": APP},
                                                 "spec": {"containers": [{"name": "s", "image": "i"}]}})
    assert datastore.get("b-rank-0") is b  # re-list keeps unchanged endpoints (and their in-flight counts)


async def test_event_cut_in_half_is_redelivered(cluster, datastore, discover, fake_kube):
    await cluster.create_pool("pool", APP, [8000])
    await discover()
    await eventually(lambda: datastore.synced.is_set(), what="synced")
    watches = fake_kube.requests[("watch", "pods")]
    fake_kube.cut_next_event()
    await cluster.create_pod("a", APP, "10.9.0.1")  # its ADDED (or the status MODIFIED) is cut mid-event
    await eventually(lambda: names(datastore) == ["a-rank-0"], what="pod seen after the cut")
    assert fake_kube.requests[("watch", "pods")] > watches
    assert fake_kube.requests[("list", "pods")] == 1  # resumed from the resourceVersion, no re-list


async def test_dropped_streams_resume_without_relisting(cluster, datastore, discover, fake_kube):
    await cluster.create_pool("pool", APP, [8000])
    await discover()
    await eventually(lambda: datastore.synced.is_set(), what="synced")
    for i in range(3):
        fake_kube.drop_watches()
        await cluster.create_pod(f"p{i}", APP, f"10.10.0.{i + 1}")
    await eventually(lambda: len(datastore.endpoints()) == 3, what="all pods despite dropped streams")
    assert fake_kube.requests[("list", "pods")] == 1


async def test_server_side_watch_timeout(cluster, datastore, discover, fake_kube):
    fake_kube.watch_timeout_max = 0.1
    await cluster.create_pool("pool", APP, [8000])
    await discover()
    await eventually(lambda: fake_kube.requests[("watch", "pods")] >= 4, what="several watch streams")
    await cluster.create_pod("a", APP, "10.11.0.1")
    await eventually(lambda: names(datastore) == ["a-rank-0"], what="event across stream renewals")
    assert fake_kube.requests[("list", "pods")] == 1


async def test_bookmarks_advance_the_resource_version(cluster, datastore, discover, fake_kube):
    await cluster.create_pool("pool", APP, [8000])
    d = await discover()
    await eventually(lambda: datastore.synced.is_set(), what="synced")
    for i in range(3):  # changes the pod watch filters out still move the global resourceVersion
        await cluster.create_pod(f"x{i}", {"app": "unrelated"}, f"10.12.0.{i + 1}")
    rv = str(fake_kube.rv)
    await eventually(lambda: d.resource_version("Pod") == rv, what="a bookmark advanced the client")
    assert fake_kube.last_bookmark_rv >= int(rv)
    fake_kube.compact()  # everything before now expires: only a client that saw a bookmark resumes cleanly
    fake_kube.drop_watches()
    await cluster.create_pod("a", APP, "10.12.1.1")
    await eventually(lambda: names(datastore) == ["a-rank-0"], what="resumed from the bookmark")
    assert fake_kube.requests[("list", "pods")] == 1


async def test_api_server_down_at_start(datastore, tmp_path, caplog):
    port = free_ports()  # nothing listens there yet
    fake = FakeKube(bookmark_interval=0.05)
    fake.port = port
    kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig")
    fake.create("inferencepools", "default", {"metadata": {"name": "pool"}, "spec": {
        "selector": {"matchLabels": APP}, "targetPorts": [{"number": 8000}]}})
    fake.create("pods", "default", {"metadata": {"name": "a", "labels": APP},
                                    "spec": {"containers": [{"name": "s", "image": "i"}]}})
    fake.patch("pods", "default", "a", {"status": {"podIP": "10.13.0.1", "conditions": [
        {"type": "Ready", "status": "True"}]}}, subresource="status")
    d = KubernetesDiscovery(datastore, namespace="default", pool_name="pool", kubeconfig=kubeconfig, options=FAST)
    await d.start()
    try:
        await eventually(lambda: any("list/watch failed" in r.getMessage() for r in caplog.records),
                         what="connection errors noticed")
        assert not datastore.synced.is_set()
        await fake.start(port)
        await eventually(lambda: datastore.synced.is_set(), what="synced once the API server is up")
        assert names(datastore) == ["a-rank-0"]

        await fake.stop()  # restart keeping the history: resume without a re-list
        await fake.start(port)
        fake.delete("pods", "default", "a", grace=0)
        await eventually(lambda: names(datastore) == [], what="event after restart")
        assert d.relists == 0
    finally:
        await d.stop()
        await fake.stop()


async def test_unusable_pool_spec_means_no_endpoints(cluster, datastore, discover, fake_kube):
    await cluster.create_pool("pool", APP, [8000])
    await cluster.create_pod("a", APP, "10.14.0.1")
    await discover()
    await eventually(lambda: names(datastore) == ["a-rank-0"], what="initial")
    # Bypass validation to simulate a pool object EPP cannot use (e.g. a newer API shape).
    obj = fake_kube.get("inferencepools", "default", "pool")
    fake_kube._commit("inferencepools", "default", obj, {**obj, "spec": {"targetPorts": []}})
    await eventually(lambda: names(datastore) == [], what="unusable pool: no endpoints")


async def test_fake_validates_pools_like_the_crd(cluster):
    from kubernetes_asyncio.client.exceptions import ApiException

    for selector, ports in [({}, [8000]), (APP, []), (APP, [8000, 8000]), (APP, list(range(8000, 8009)))]:
        with pytest.raises(ApiException) as err:
            await cluster.create_pool("bad", selector, ports)
        assert err.value.status == 422


async def test_missing_kubeconfig_is_a_config_error(datastore, tmp_path):
    d = KubernetesDiscovery(datastore, namespace="default", pool_name="pool", kubeconfig=tmp_path / "nope")
    with pytest.raises(ConfigError, match="Kubernetes client configuration"):
        await d.start()


def test_selector_mode_needs_selector_and_ports(datastore):
    with pytest.raises(ConfigError):
        KubernetesDiscovery(datastore, namespace="ns", selector=APP)
    with pytest.raises(ValueError):
        KubernetesDiscovery(datastore, namespace="ns", selector=APP, target_ports=[0])


# -- pure functions --------------------------------------------------------------------------------------------


def pod(name="p", labels=APP, ip="10.0.0.1", ready="True", deleting=False, annotations=None):
    meta = {"name": name, "labels": labels, "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]}}


POOL = PoolSpec(APP, (8000, 8001))


@pytest.mark.parametrize("obj,expected", [
    (pod(), ["p-rank-0@10.0.0.1:8000", "p-rank-1@10.0.0.1:8001"]),
    (pod(ready="False"), []),
    (pod(deleting=True), []),
    (pod(ip=""), []),
    (pod(labels={"app": "x"}), []),
    (pod(annotations={"inference.networking.k8s.io/active-ports": "8001"}), ["p-rank-1@10.0.0.1:8001"]),
    (pod(annotations={"inference.networking.k8s.io/active-ports": ""}), []),
    (pod(ip="fd00::1"), ["p-rank-0@[fd00::1]:8000", "p-rank-1@[fd00::1]:8001"]),
], ids=["ready", "not-ready", "terminating", "no-ip", "not-selected", "active-ports", "no-active-ports", "ipv6"])
def test_pod_endpoints(obj, expected):
    assert [f"{e.name}@{e.hostport}" for e in pod_endpoints(obj, POOL)] == expected


def test_pod_endpoints_carry_the_node_the_pod_is_bound_to():
    """The scheduler extender groups endpoints by node: a bound Pod's ``spec.nodeName``, "" before binding."""
    bound = dict(pod(), spec={"nodeName": "gpu-node-3"})
    assert {e.node for e in pod_endpoints(bound, POOL)} == {"gpu-node-3"}
    assert {e.node for e in pod_endpoints(pod(), POOL)} == {""}


@pytest.mark.parametrize("spec", [
    {}, {"selector": {"matchLabels": {}}, "targetPorts": [{"number": 1}]},
    {"selector": {"matchLabels": APP}, "targetPorts": []},
    {"selector": {"matchLabels": APP}, "targetPorts": [{"number": 70000}]},
    {"selector": {"matchLabels": APP}, "targetPorts": ["8000"]},
])
def test_pool_spec_rejects(spec):
    with pytest.raises(ValueError):
        PoolSpec.from_object({"spec": spec})


def test_pool_spec_selector_string():
    spec = PoolSpec.from_object({"spec": {"selector": {"matchLabels": {"b": "2", "a": "1"}},
                                          "targetPorts": [{"number": 8000}]}})
    assert spec.label_selector() == "a=1,b=2" and spec.target_ports == (8000,)


@pytest.mark.parametrize("text,expected", [
    ("app=vllm", {"app": "vllm"}),
    (" app == vllm , tier=gpu,", {"app": "vllm", "tier": "gpu"}),
    ("llm-d.ai/role=decode", {"llm-d.ai/role": "decode"}),
])
def test_parse_selector(text, expected):
    assert parse_selector(text) == expected


@pytest.mark.parametrize("text", ["", "app", "app!=x", "=x", ","])
def test_parse_selector_rejects(text):
    with pytest.raises(ConfigError):
        parse_selector(text)


def test_discovery_from_options(datastore):
    pool = discovery_from_options(datastore, pool_name="p", namespace="ns")
    assert pool.pool_name == "p" and pool.pool is None
    sel = discovery_from_options(datastore, pool_name=None, namespace="ns", endpoint_selector="app=vllm",
                                 target_ports=[8000, 8001])
    assert sel.pool == PoolSpec({"app": "vllm"}, (8000, 8001))
    for kw in (dict(pool_name="p", endpoint_selector="a=b"), dict(pool_name=None),
               dict(pool_name=None, endpoint_selector="a=b"), dict(pool_name=None, endpoint_selector="a=b",
                                                                    target_ports=[0])):
        with pytest.raises(ConfigError):
            discovery_from_options(datastore, namespace="ns", **kw)
