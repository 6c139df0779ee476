"""HA mode end to end: two ``epp serve`` processes started with the reference Helm chart's args for two replicas
(``--ha-enable-leader-election``, json logs, ...) against one API server; exactly one reports ready, and when it
gets SIGTERM the other takes the Lease and becomes ready while it drains. Also: a v1alpha2 InferencePool (``--pool-group
inference.networking.x-k8s.io``) and the legacy metric flags, through :class:`~epp.runtime.app.EppApp`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson

from epp._pb.grpc.health.v1 import health_pb2
from epp.cli.main import build_parser
from epp.cli.serve import options_from_args
from epp.datalayer.leader import lease_name_for
from epp.runtime.app import EppApp, ServeOptions
from epp.runtime.ports import free_ports

from ..conftest import eventually
from .fake_kube import FakeKube
from .helpers import grpc_health
from .k8s_cluster import Cluster

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"""


class Replica:
    """One ``epp serve`` process with the chart's args (plus ports, since two share this host)."""

    def __init__(self, cluster: Cluster, config: Path, log: Path) -> None:
        self.health_port = free_ports()
        args = ["--pool-name", "pool", "--pool-namespace", cluster.namespace, "--pool-group",
                "inference.networking.k8s.io", "--zap-encoder", "json", "--config-file", str(config),
                "--ha-enable-leader-election", "--tracing=false", "--metrics-endpoint-auth=false",
                "--grpc-port", str(free_ports()), "--grpc-health-port", str(self.health_port), "--metrics-port", "-1",
                "--host", "127.0.0.1"]
        env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-m", "epp.cli.main", "serve", *args], env=env,
                                     stdout=subprocess.DEVNULL, stderr=log.open("wb"))

    async def status(self, service: str) -> int | None:
        """The health service's answer for ``service``, or None while it does not answer."""
        return await grpc_health(self.health_port, service)

    def stop(self) -> int:
        """SIGTERM until the process exits: the first starts the drain window (30 s with the chart's args, which
        use Kubernetes discovery), the next ends it (repeated, since signals sent close together may merge)."""
        for _ in range(60):
            if self.proc.poll() is not None:
                break
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(0.5)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.wait(30)

    def json_lines(self) -> list[dict[str, object]]:
        return [orjson.loads(line) for line in self.log.read_bytes().splitlines() if line.startswith(b"{")]


async def status_reached(replica: Replica, service: str, wanted: int) -> None:
    """Wait until ``replica`` answers ``wanted`` for ``service``; fail at once, with its log, if it exits."""

    async def reached() -> bool:
        assert replica.proc.poll() is None, replica.log.read_text()
        return await replica.status(service) == wanted

    await eventually(reached, lambda: f"{service} to reach {wanted}: {replica.log.read_text()[-2000:]}",
                     timeout=30.0, interval=0.1)


async def test_two_replicas_with_the_charts_args_one_leads_and_the_other_takes_over(
        cluster: Cluster, fake_kube: FakeKube, tmp_path: Path) -> None:
    await cluster.create_pool("pool", {"app": "vllm"}, [8000])
    await cluster.create_pod("a", {"app": "vllm"}, "10.9.0.1")
    config = tmp_path / "default-plugins.yaml"
    config.write_text(CONFIG)
    first = Replica(cluster, config, tmp_path / "first.log")
    second: Replica | None = None
    try:
        await status_reached(first, "readiness", SERVING)
        assert await first.status("liveness") == SERVING
        second = Replica(cluster, config, tmp_path / "second.log")
        await status_reached(second, "liveness", SERVING)  # up and synced, but a follower
        lease = fake_kube.get("leases", cluster.namespace, lease_name_for(cluster.namespace, "pool"))
        holder = lease["spec"]["holderIdentity"]
        assert holder and await second.status("readiness") != SERVING
        assert await first.status("readiness") == SERVING
        # SIGTERM: the leader goes NOT_SERVING and hands the Lease over at once, and keeps serving for its drain
        # window meanwhile; a second signal ends the window. (The stop is waited for in a thread: the fake API
        # server runs on this test's event loop and must answer the release.)
        first.proc.send_signal(signal.SIGTERM)
        await status_reached(second, "readiness", SERVING)
        assert first.proc.poll() is None and await first.status("readiness") == NOT_SERVING
        assert await asyncio.to_thread(first.stop) == 0
        lease = fake_kube.get("leases", cluster.namespace, lease_name_for(cluster.namespace, "pool"))
        assert lease["spec"]["holderIdentity"] not in ("", holder)
        assert lease["spec"]["leaseTransitions"] >= 1
    finally:
        await asyncio.to_thread(first.stop)
        if second is not None:
            await asyncio.to_thread(second.stop)
    lines = first.json_lines()
    assert lines and all({"level", "ts", "logger", "msg"} <= line.keys() for line in lines)
    assert any("leader" in str(line["msg"]).lower() for line in lines)


async def test_a_v1alpha2_pool_with_the_pool_group_flag(cluster: Cluster, fake_kube: FakeKube, tmp_path: Path) -> None:
    """``--pool-group inference.networking.x-k8s.io``: the v1alpha2 InferencePool (flat selector,
    ``targetPortNumber``) drives discovery; ``--model-server-metrics-port`` moves the scrape port."""
    from kubernetes_asyncio.client.exceptions import ApiException

    body = {"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferencePool",
            "metadata": {"name": "old"}, "spec": {"selector": {"app": "vllm"}, "targetPortNumber": 8000,
                                                   "extensionRef": {"name": "epp"}}}
    try:
        await cluster.custom.create_namespaced_custom_object("inference.networking.x-k8s.io", "v1alpha2",
                                                             cluster.namespace, "inferencepools", body)
    except ApiException as exc:  # the fake serves whatever group it is given routes for
        raise AssertionError(f"the fake API server refused a v1alpha2 pool: {exc}") from exc
    await cluster.create_pod("a", {"app": "vllm"}, "10.9.0.1")
    args = build_parser().parse_args(["serve", "--pool-name", "old", "--pool-namespace", cluster.namespace,
                                      "--pool-group", "inference.networking.x-k8s.io", "--kubeconfig",
                                      str(cluster.kubeconfig), "--model-server-metrics-port", "9400"])
    options = options_from_args(args)
    options = ServeOptions(**{**options.__dict__, "grpc_port": None, "health_port": None, "metrics_port": None})
    app = EppApp(options)
    await app.start()
    try:
        await app.wait_ready()
        await eventually(lambda: [e.spec.name for e in app.datastore.endpoints()] == ["a-rank-0"])
        spec = app.datastore.endpoints()[0].spec
        assert (spec.address, spec.port, spec.metrics_port) == ("10.9.0.1", 8000, 9400)
    finally:
        await app.stop()
