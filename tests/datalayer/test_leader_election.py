"""Leader election over a Lease (:mod:`epp.datalayer.leader`) through the real ``kubernetes_asyncio`` client.

Tests marked ``k8s_real`` only use the Kubernetes API and also run against the cluster of ``KUBECONFIG``; the
others inject faults the fake API server offers (an API server that goes away, slow writes that make replicas
race). A :class:`Leaders` monitor samples every elector's ``is_leader`` all along a test, so "never two
leaders" is checked over the whole run, not at one instant.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import uuid
from datetime import datetime, timedelta
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from epp.datalayer.leader import LeaderElector, lease_name_for
from epp.errors import ConfigError

from ..conftest import Servers, eventually
from .fake_kube import FakeKube
from .k8s_cluster import Cluster

TIMING = {"lease_duration": 2.0, "renew_deadline": 1.0, "retry_period": 0.1}
WAIT = 15.0  # the overall limit of every wait below: generous, never a measure of speed
MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
Make = Callable[..., Awaitable[LeaderElector]]


class Leaders:
    """Samples the electors' ``is_leader`` until stopped: ``most`` is the largest number of simultaneous leaders
    seen, ``ever`` every identity that led at some point."""

    def __init__(self) -> None:
        self.electors: list[LeaderElector] = []
        self.most = 0
        self.ever: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def watch(self, elector: LeaderElector) -> None:
        self.electors.append(elector)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sample())

    def current(self) -> list[LeaderElector]:
        return [e for e in self.electors if e.is_leader]

    async def _sample(self) -> None:
        while True:
            leading = self.current()
            self.most = max(self.most, len(leading))
            self.ever.update(e.identity for e in leading)
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


@pytest.fixture
async def leaders() -> AsyncIterator[Leaders]:
    monitor = Leaders()
    yield monitor
    await monitor.stop()


@pytest.fixture
def lease(cluster: Cluster) -> str:
    return lease_name_for(cluster.namespace, f"pool-{uuid.uuid4().hex[:6]}")


@pytest.fixture
def make(cluster: Cluster, lease: str, leaders: Leaders, servers: Servers) -> Make:
    """Start an elector for this test's Lease (watched by ``leaders``); all are stopped at teardown."""

    async def start(identity: str, **timing: float) -> LeaderElector:
        elector = LeaderElector(namespace=cluster.namespace, name=lease, identity=identity,
                                kubeconfig=cluster.kubeconfig, **{**TIMING, **timing})
        servers.defer(lambda: elector.stop(release=False))  # before start: a half-started elector is stopped too
        leaders.watch(elector)
        await elector.start()
        return elector

    return start


async def read_lease(cluster: Cluster, name: str) -> dict[str, Any]:
    """The Lease as the API server stores it (raw JSON: MicroTimes as written)."""
    from kubernetes_asyncio import client

    resp = await client.CoordinationV1Api(cluster.api).read_namespaced_lease(name, cluster.namespace,
                                                                             _preload_content=False)
    async with resp:
        assert resp.status == 200, await resp.text()
        return json.loads(await resp.read())  # type: ignore[no-any-return]


async def write_lease(cluster: Cluster, name: str, spec: dict[str, Any], current: dict[str, Any] | None) -> None:
    """Create the Lease, or replace ``current`` (carrying its resourceVersion): a foreign holder at work."""
    from kubernetes_asyncio import client

    api = client.CoordinationV1Api(cluster.api)
    if current is None:
        await api.create_namespaced_lease(cluster.namespace, {"apiVersion": "coordination.k8s.io/v1",
                                                              "kind": "Lease", "metadata": {"name": name},
                                                              "spec": spec})
    else:
        await api.replace_namespaced_lease(name, cluster.namespace, {**current, "spec": spec})


def when(micro: str) -> datetime:
    return datetime.fromisoformat(micro.replace("Z", "+00:00"))


async def one_leader(leaders: Leaders) -> LeaderElector:
    await eventually(lambda: len(leaders.current()) == 1, timeout=WAIT, what="a leader")
    return leaders.current()[0]


# -- construction ---------------------------------------------------------------------------------------------


def test_lease_name_and_default_identity_follow_the_reference() -> None:
    assert lease_name_for("prod", "llama") == "epp-prod-llama.gateway-api-inference-extension.sigs.k8s.io"
    elector = LeaderElector(namespace="prod", name=lease_name_for("prod", "llama"))
    host, _, tail = elector.identity.rpartition("_")
    assert host == socket.gethostname() and uuid.UUID(tail)
    assert not elector.is_leader


@pytest.mark.parametrize("timing", [
    {"lease_duration": 10.0, "renew_deadline": 10.0, "retry_period": 2.0},
    {"lease_duration": 15.0, "renew_deadline": 2.0, "retry_period": 2.0},
    {"lease_duration": 15.0, "renew_deadline": 10.0, "retry_period": 0.0},
], ids=["lease-not-above-deadline", "deadline-not-above-jittered-retry", "no-retry-period"])
def test_inconsistent_timing_is_a_config_error(timing: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="lease duration"):
        LeaderElector(namespace="ns", name="lease", **timing)


# -- behaviour against any API server --------------------------------------------------------------------------


@pytest.mark.k8s_real
async def test_single_elector_acquires_then_renews(cluster, lease, make):
    elector = await make("epp-a")
    await eventually(lambda: elector.is_leader, timeout=WAIT, what="leadership")
    first = await read_lease(cluster, lease)
    spec = first["spec"]
    assert spec["holderIdentity"] == "epp-a"
    assert spec["leaseDurationSeconds"] == 2 and spec["leaseTransitions"] == 0
    assert MICRO_TIME.fullmatch(spec["acquireTime"]) and MICRO_TIME.fullmatch(spec["renewTime"])

    renewed: dict[str, Any] = {}

    async def moved() -> bool:
        renewed.update(await read_lease(cluster, lease))
        return renewed["spec"]["renewTime"] != spec["renewTime"]

    for _ in range(int(WAIT / 0.05)):
        if await moved():
            break
        await asyncio.sleep(0.05)
    assert renewed["spec"]["renewTime"] != spec["renewTime"], "the leader never renewed"
    assert when(renewed["spec"]["renewTime"]) > when(spec["renewTime"])
    assert renewed["spec"]["acquireTime"] == spec["acquireTime"] and renewed["spec"]["leaseTransitions"] == 0
    assert elector.is_leader


@pytest.mark.k8s_real
async def test_changed_resolves_on_gaining_and_losing_leadership(cluster, lease):
    elector = LeaderElector(namespace=cluster.namespace, name=lease, identity="epp-a",
                            kubeconfig=cluster.kubeconfig, **TIMING)
    gained = asyncio.ensure_future(elector.changed())
    await elector.start()
    try:
        await asyncio.wait_for(gained, WAIT)
        assert elector.is_leader
        lost = asyncio.ensure_future(elector.changed())
        assert not lost.done()
    finally:
        await elector.stop()
    await asyncio.wait_for(lost, WAIT)
    assert not elector.is_leader


@pytest.mark.k8s_real
async def test_two_electors_one_leads_while_the_other_follows(cluster, lease, make, leaders):
    await make("epp-a")
    await make("epp-b")
    leader = await one_leader(leaders)
    seen: set[str] = set()

    async def renewals() -> int:
        seen.add((await read_lease(cluster, lease))["spec"]["renewTime"])
        return len(seen)

    # 25 renews 0.1 s apart outlast the 2 s lease many times over: the follower saw them and kept off.
    for _ in range(int(WAIT / 0.05)):
        if await renewals() >= 25:
            break
        await asyncio.sleep(0.05)
    assert len(seen) >= 25
    record = (await read_lease(cluster, lease))["spec"]
    assert record["holderIdentity"] == leader.identity and record["leaseTransitions"] == 0
    assert leaders.most == 1 and leaders.ever == {leader.identity}


@pytest.mark.k8s_real
async def test_release_writes_the_released_record(cluster, lease, make):
    elector = await make("epp-a")
    await eventually(lambda: elector.is_leader, timeout=WAIT, what="leadership")
    await elector.stop(release=True)
    assert not elector.is_leader
    spec = (await read_lease(cluster, lease))["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1 and spec["leaseTransitions"] == 0
    assert spec["acquireTime"] == spec["renewTime"] and MICRO_TIME.fullmatch(spec["renewTime"])


@pytest.mark.k8s_real
async def test_released_lease_is_taken_over_without_waiting_for_expiry(cluster, lease, make, leaders):
    # A 60 s lease: a follower that waited for it to expire would run into WAIT long before.
    slow = {"lease_duration": 60.0, "renew_deadline": 40.0, "retry_period": 0.1}
    a = await make("epp-a", **slow)
    await eventually(lambda: a.is_leader, timeout=WAIT, what="epp-a leading")
    b = await make("epp-b", **slow)
    await eventually(lambda: b.holder == "epp-a", timeout=WAIT,
                     what="epp-b seeing epp-a's lease")
    await a.stop(release=True)
    await eventually(lambda: b.is_leader, timeout=WAIT, what="epp-b taking over")
    spec = (await read_lease(cluster, lease))["spec"]
    assert spec["holderIdentity"] == "epp-b" and spec["leaseTransitions"] == 1
    assert spec["leaseDurationSeconds"] == 60
    assert leaders.most == 1


@pytest.mark.k8s_real
async def test_killed_leader_is_replaced_only_after_its_lease_expires(cluster, lease, make, leaders):
    a = await make("epp-a")
    await eventually(lambda: a.is_leader, timeout=WAIT, what="epp-a leading")
    b = await make("epp-b")
    await eventually(lambda: b.holder == "epp-a", timeout=WAIT,
                     what="epp-b seeing epp-a's lease")
    await a.stop(release=False)  # as a crash: no release
    last = (await read_lease(cluster, lease))["spec"]
    assert last["holderIdentity"] == "epp-a" and not b.is_leader  # the 2 s lease is still valid here

    await eventually(lambda: b.is_leader, timeout=WAIT, what="epp-b taking over")
    taken = (await read_lease(cluster, lease))["spec"]
    assert taken["holderIdentity"] == "epp-b" and taken["leaseTransitions"] == last["leaseTransitions"] + 1
    # epp-b waited a whole lease after epp-a's last renew (same machine clock; microsecond truncation aside)
    assert when(taken["acquireTime"]) - when(last["renewTime"]) >= timedelta(seconds=2) - timedelta(milliseconds=1)
    assert leaders.most == 1


@pytest.mark.k8s_real
async def test_a_foreign_holder_that_keeps_renewing_is_respected(cluster, lease, make, leaders):
    from epp.datalayer.leader import micro_time

    stamp = micro_time()
    foreign = {"holderIdentity": "other-epp", "leaseDurationSeconds": 2, "acquireTime": stamp, "renewTime": stamp,
               "leaseTransitions": 4}
    await write_lease(cluster, lease, foreign, None)
    elector = await make("epp-a")
    renews = 0
    # 30 renews 0.1 s apart: the 2 s lease would have expired several times over without them.
    while renews < 30:
        await asyncio.sleep(0.1)
        current = await read_lease(cluster, lease)
        assert current["spec"]["holderIdentity"] == "other-epp"
        await write_lease(cluster, lease, {**foreign, "renewTime": micro_time()}, current)
        renews += 1
    assert not elector.is_leader and leaders.ever == set()

    last = (await read_lease(cluster, lease))["spec"]  # the foreign holder stops renewing here
    await eventually(lambda: elector.is_leader, timeout=WAIT, what="taking over the expired lease")
    spec = (await read_lease(cluster, lease))["spec"]
    assert spec["holderIdentity"] == "epp-a" and spec["leaseTransitions"] == 5
    assert when(spec["acquireTime"]) - when(last["renewTime"]) >= timedelta(seconds=2) - timedelta(milliseconds=1)


# -- faults only the fake can inject ---------------------------------------------------------------------------


async def test_api_server_outage_costs_leadership_then_it_is_regained(cluster, lease, make, fake_kube: FakeKube,
                                                                       caplog):
    caplog.set_level(logging.INFO, logger="epp.datalayer.leader")
    elector = await make("epp-a", lease_duration=3.0, renew_deadline=1.5)
    await eventually(lambda: elector.is_leader, timeout=WAIT, what="leadership")
    lost = asyncio.ensure_future(elector.changed())
    await fake_kube.stop()
    assert elector.is_leader  # the renew deadline has not passed yet
    await asyncio.wait_for(lost, WAIT)
    assert not elector.is_leader

    regained = asyncio.ensure_future(elector.changed())
    await asyncio.sleep(0.5)  # a few more failed tries while the server is away
    await fake_kube.start()
    await asyncio.wait_for(regained, WAIT)
    assert elector.is_leader
    spec = (await read_lease(cluster, lease))["spec"]
    assert spec["holderIdentity"] == "epp-a" and spec["leaseTransitions"] == 0  # its own record, renewed

    records = [r for r in caplog.records if r.name == "epp.datalayer.leader"]
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert 1 <= len(warnings) <= 3 and all(r.exc_info is None for r in warnings)  # once per distinct error
    messages = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert any("lost leadership" in m for m in messages) and any("answers again" in m for m in messages)


async def test_racing_creates_yield_one_leader(lease, make, leaders, fake_kube: FakeKube):
    fake_kube.delay[("create", "leases")] = 0.3  # every replica reads "not found" before the first create lands
    for name in ("epp-a", "epp-b", "epp-c", "epp-d"):
        await make(name)
    leader = await one_leader(leaders)
    assert fake_kube.requests[("create", "leases")] >= 2
    # The losing creates are answered 0.3 s after they arrived, which on a loaded machine can be after the winner's
    # landed and made its leader: wait for their 409s rather than expect them already.
    await eventually(lambda: fake_kube.conflicts["leases"] >= 1, timeout=WAIT, what="a losing create's 409")
    await eventually(lambda: fake_kube.requests[("get", "leases")] >= 40, timeout=WAIT, what="more rounds")
    assert leaders.most == 1 and leaders.current() == [leader]


async def test_racing_takeovers_yield_one_leader(cluster, lease, make, leaders, fake_kube: FakeKube):
    a = await make("epp-a")
    await eventually(lambda: a.is_leader, timeout=WAIT, what="epp-a leading")
    others = [await make(name) for name in ("epp-b", "epp-c", "epp-d")]
    await eventually(lambda: all(e.holder == "epp-a" for e in others),
                     timeout=WAIT, what="the followers seeing epp-a's lease")
    fake_kube.delay[("update", "leases")] = 0.3  # followers read the released lease while one takeover is in flight
    conflicts = fake_kube.conflicts["leases"]
    await a.stop(release=True)
    winner = await one_leader(leaders)
    await eventually(lambda: fake_kube.conflicts["leases"] > conflicts, timeout=WAIT, what="a lost race")
    spec = (await read_lease(cluster, lease))["spec"]
    assert spec["holderIdentity"] == winner.identity and spec["leaseTransitions"] == 1
    assert leaders.most == 1


async def test_a_hanging_api_server_costs_leadership_at_the_renew_deadline(cluster, lease, make,
                                                                           fake_kube: FakeKube):
    elector = await make("epp-a")
    await eventually(lambda: elector.is_leader, timeout=WAIT, what="leadership")
    lost = asyncio.ensure_future(elector.changed())
    fake_kube.delay[("get", "leases")] = 3600.0  # accepts the connection, never answers
    await asyncio.wait_for(lost, WAIT)  # the renew in flight is abandoned at the deadline
    assert not elector.is_leader
    regained = asyncio.ensure_future(elector.changed())
    del fake_kube.delay[("get", "leases")]
    await asyncio.wait_for(regained, WAIT)
    assert elector.is_leader and (await read_lease(cluster, lease))["spec"]["holderIdentity"] == "epp-a"
