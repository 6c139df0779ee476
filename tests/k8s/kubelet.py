"""Running the rendered workloads on this host the way a kubelet would, against the in-test API server.

- :func:`start_sims`: the simulated model servers' Deployment becomes Pods in the fake API server (the template's
  labels, a distinct loopback IP each, Ready) and real ``epp_sim`` servers, built from the container's own
  arguments, listening on that IP and the container's port.
- :class:`EppPod`: EPP's container becomes an ``epp serve`` process with the rendered arguments, changed only where
  a laptop must differ from a Pod: ``--kubeconfig`` (the fake's), ``--host 127.0.0.1``, every port flag moved to a
  free port, and the mounted ConfigMaps written to a temporary directory that replaces their mount path.
- :func:`api_requests`: what a process asked the API server, as RBAC sees it: ``(verb, apiGroup, resource)``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from epp._pb.grpc.health.v1 import health_pb2
from epp.runtime.ports import free_ports
from epp_sim import SimServer
from epp_sim.cli import build_configs, parse_args

from ..conftest import Servers
from ..datalayer.fake_kube import FakeKube
from ..datalayer.fake_kube_auth import AuthReviews
from ..datalayer.fake_kube_schema import KINDS
from ..datalayer.helpers import grpc_health
from ..datalayer.k8s_cluster import Cluster
from .manifests import PORT_FLAGS, Container, Rendered, container, flag_values

SERVING = health_pb2.HealthCheckResponse.SERVING
# The fake's resource names -> (apiGroup, resource), as RBAC names them.
GROUP_RESOURCE = {plural: (kind.api_version.rpartition("/")[0], kind.plural) for plural, kind in KINDS.items()}
GROUP_RESOURCE |= {"tokenreviews": ("authentication.k8s.io", "tokenreviews"),
                   "subjectaccessreviews": ("authorization.k8s.io", "subjectaccessreviews")}


def api_requests(counts: Counter[tuple[str, str]]) -> set[tuple[str, str, str]]:
    """``(verb, apiGroup, resource)`` of every request counted in ``counts`` (the fake's ``requests``)."""
    return {(verb, *GROUP_RESOURCE[plural]) for (verb, plural), n in counts.items() if n > 0}


async def start_sims(rendered: Rendered, cluster: Cluster, servers: Servers) -> list[tuple[str, SimServer]]:
    """Run the ``epp-sim`` Deployment's replicas as Pods of the fake API server backed by real simulated servers;
    returns ``(address, server)`` per Pod. Each Pod gets its own loopback address, since the InferencePool fixes
    the port."""
    sim = container(rendered, "epp-sim", "epp-sim")
    labels = sim.workload["spec"]["template"]["metadata"]["labels"]
    (port,) = sim.container_ports().values()
    started = []
    base = f"127.{random.randrange(64, 250)}.{random.randrange(1, 250)}"
    for i in range(sim.workload["spec"]["replicas"]):
        name = f"epp-sim-{i}"
        argv = sim.argv(name)
        assert argv[0] == "epp-sim"
        (config,), _ = build_configs(parse_args(argv[1:]))
        ip = f"{base}.{i + 1}"
        try:
            server = await servers.start(SimServer(config), ip, port)
        except OSError as exc:  # a wildcard listener on the pool's port blocks every loopback address
            raise AssertionError(f"cannot listen on {ip}:{port} for Pod {name}: {exc}") from exc
        await cluster.create_pod(name, labels, ip)
        started.append((f"{ip}:{port}", server))
    return started


class EppPod:
    """EPP's container as a local ``epp serve`` process (see the module docstring). ``ports`` maps the container's
    port names to the local ports used instead."""

    def __init__(self, rendered: Rendered, kubeconfig: Path, workdir: Path, pod_name: str = "epp-0") -> None:
        self.container: Container = container(rendered, "epp", "epp")
        argv = self.container.argv(pod_name)
        assert argv[:2] == ["epp", "serve"]
        flags = flag_values(argv[2:])
        self.ports: dict[str, int] = {}
        for flag, port_name in PORT_FLAGS.items():
            if flag in flags:
                self.ports[port_name] = free_ports()
                flags[flag] = str(self.ports[port_name])
        for mount, name in self.container.config_maps():
            local = workdir / "volumes" / name
            local.mkdir(parents=True)
            for key, text in rendered.get("ConfigMap", name)["data"].items():
                (local / key).write_text(text)
            flags = {k: str(local) + v[len(mount):] if v.startswith(mount + "/") else v for k, v in flags.items()}
        flags |= {"--host": "127.0.0.1", "--kubeconfig": str(kubeconfig)}
        self.flags = flags
        self.log = workdir / f"{pod_name}.log"
        env = dict(os.environ, **self.container.env(pod_name))
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "epp.cli.main", "serve",
                                      *(f"{k}={v}" for k, v in flags.items())],
                                     env=env, stdout=subprocess.DEVNULL, stderr=self.log.open("wb"))

    def local_port(self, container_port: int) -> int:
        """The local port standing in for ``container_port`` (as a probe names it)."""
        names = {number: name for name, number in self.container.container_ports().items()}
        return self.ports[names[container_port]]

    async def health(self, service: str, port: int | None = None) -> int | None:
        """The gRPC health answer for ``service``, or None while nothing answers."""
        return await grpc_health(port or self.ports["grpc-health"], service)

    async def probe(self, name: str) -> bool:
        """Whether the container's ``name`` probe (a gRPC one) would pass now."""
        grpc_probe = self.container.spec[name]["grpc"]
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        return await self.health(grpc_probe["service"], self.local_port(grpc_probe["port"])) == SERVING

    def stop(self) -> int:
        """SIGTERM, as the kubelet sends, then again until it exits: the first starts the drain window, the next
        ends it (signals sent close together may merge, hence the repeats)."""
        for _ in range(120):
            if self.proc.poll() is not None:
                break
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(0.5)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.wait(30)


async def start_api_server(servers: Servers, namespace: str) -> tuple[FakeKube, AuthReviews]:
    """The fake API server, answering TokenReviews and SubjectAccessReviews, with the manifests' namespace."""
    fake = FakeKube(bookmark_interval=0.05)
    reviews = AuthReviews(fake)
    fake.add_namespace(namespace)
    return await servers.start(fake), reviews
