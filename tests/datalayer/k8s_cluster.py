"""The tests' cluster driver: creates and changes Pods, InferencePools, InferenceObjectives and
InferenceModelRewrites through ``kubernetes_asyncio``.

The same driver runs against :class:`fake_kube.FakeKube` or a real cluster (``KUBECONFIG``), so the Kubernetes
test bodies do not depend on which backend answers. Pods are bound to a node that does not exist
(``spec.nodeName``), so no kubelet ever runs them or overwrites the status the tests write through the
``status`` subresource; deleting such a Pod with a grace period leaves it terminating, as on a real node.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from epp.datalayer.kubernetes import POOL_GROUP, POOL_PLURAL, POOL_VERSION, make_api_client
from epp.framework.objectives import OBJECTIVE_PLURAL, POLICY_GROUPS, POLICY_VERSION, REWRITE_PLURAL

from .fake_kube import FakeKube

NODE = "epp-test-no-such-node"


class Cluster:
    """One namespace on one API server, driven as an operator (or the kubelet) would."""

    def __init__(self, api: Any, namespace: str, kubeconfig: Path, fake: FakeKube | None) -> None:
        from kubernetes_asyncio import client

        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.kubeconfig = kubeconfig
        self.fake = fake

    @classmethod
    async def connect(cls, kubeconfig: Path, fake: FakeKube | None) -> Cluster:
        """Connect and create a fresh namespace for one test."""
        from kubernetes_asyncio import client

        api = await make_api_client(kubeconfig)
        namespace = "default" if fake is not None else f"epp-test-{uuid.uuid4().hex[:8]}"
        if fake is None:
            await client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        return cls(api, namespace, kubeconfig, fake)

    async def close(self) -> None:
        if self.fake is None:
            pods = await self.core.list_namespaced_pod(self.namespace)
            for pod in pods.items:
                await self.core.delete_namespaced_pod(pod.metadata.name, self.namespace, grace_period_seconds=0)
            await self.core.delete_namespace(self.namespace)
        await self.api.close()

    # -- InferencePools ----------------------------------------------------------------------------------------

    async def create_pool(self, name: str, selector: dict[str, str], ports: list[int]) -> None:
        body = {"apiVersion": f"{POOL_GROUP}/{POOL_VERSION}", "kind": "InferencePool", "metadata": {"name": name},
                "spec": {"selector": {"matchLabels": selector}, "targetPorts": [{"number": p} for p in ports],
                         "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}}
        await self.custom.create_namespaced_custom_object(POOL_GROUP, POOL_VERSION, self.namespace, POOL_PLURAL,
                                                          body)

    async def update_pool(self, name: str, *, selector: dict[str, str] | None = None,
                          ports: list[int] | None = None) -> None:
        obj = await self.custom.get_namespaced_custom_object(POOL_GROUP, POOL_VERSION, self.namespace,
                                                             POOL_PLURAL, name)
        if selector is not None:
            obj["spec"]["selector"] = {"matchLabels": selector}
        if ports is not None:
            obj["spec"]["targetPorts"] = [{"number": p} for p in ports]
        await self.custom.replace_namespaced_custom_object(POOL_GROUP, POOL_VERSION, self.namespace, POOL_PLURAL,
                                                           name, obj)

    async def delete_pool(self, name: str) -> None:
        await self.custom.delete_namespaced_custom_object(POOL_GROUP, POOL_VERSION, self.namespace, POOL_PLURAL,
                                                          name)

    # -- InferenceObjectives and InferenceModelRewrites ---------------------------------------------------------

    async def apply_objective(self, name: str, pool: str, priority: int | None, *,
                              group: str = POLICY_GROUPS[0]) -> None:
        """Create the InferenceObjective (in API group ``group``), or replace its spec."""
        spec: dict[str, Any] = {"poolRef": {"name": pool}}
        if priority is not None:
            spec["priority"] = priority
        await self._apply_policy(group, OBJECTIVE_PLURAL, "InferenceObjective", name, spec)

    async def apply_rewrite(self, name: str, pool: str, rules: list[dict[str, Any]], *,
                            group: str = POLICY_GROUPS[0]) -> None:
        """Create the InferenceModelRewrite (in API group ``group``), or replace its spec. ``rules`` in the CRD's
        shape."""
        await self._apply_policy(group, REWRITE_PLURAL, "InferenceModelRewrite", name,
                                 {"poolRef": {"name": pool}, "rules": rules})

    async def delete_policy(self, plural: str, name: str, *, group: str = POLICY_GROUPS[0]) -> None:
        await self.custom.delete_namespaced_custom_object(group, POLICY_VERSION, self.namespace, plural, name)

    async def _apply_policy(self, group: str, plural: str, kind: str, name: str, spec: dict[str, Any]) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        args = (group, POLICY_VERSION, self.namespace, plural)
        try:
            obj = await self.custom.get_namespaced_custom_object(*args, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {"apiVersion": f"{group}/{POLICY_VERSION}", "kind": kind,
                    "metadata": {"name": name}, "spec": spec}
            await self.custom.create_namespaced_custom_object(*args, body)
            return
        obj["spec"] = spec
        await self.custom.replace_namespaced_custom_object(*args, name, obj)

    # -- Pods --------------------------------------------------------------------------------------------------

    async def create_pod(self, name: str, labels: dict[str, str], ip: str, *, ready: bool = True,
                         annotations: dict[str, str] | None = None) -> None:
        body = {"metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
                "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 30,
                         "containers": [{"name": "server", "image": "registry.k8s.io/pause:3.9"}]}}
        await self.core.create_namespaced_pod(self.namespace, body)
        await self._status(name, ip, ready)

    async def set_ready(self, name: str, ready: bool) -> None:
        pod = await self.core.read_namespaced_pod(name, self.namespace)
        await self._status(name, pod.status.pod_ip, ready)

    async def _status(self, name: str, ip: str, ready: bool) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                  "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                  "lastTransitionTime": stamp}]}
        await self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})

    async def patch_pod_metadata(self, name: str, *, labels: dict[str, str | None] | None = None,
                                 annotations: dict[str, str | None] | None = None) -> None:
        """Merge labels/annotations into the Pod (a None value removes the key)."""
        meta: dict[str, Any] = {}
        if labels is not None:
            meta["labels"] = labels
        if annotations is not None:
            meta["annotations"] = annotations
        await self.core.patch_namespaced_pod(name, self.namespace, {"metadata": meta})

    async def delete_pod(self, name: str, *, grace: int | None = 0) -> None:
        """Delete a Pod; ``grace=None`` uses its termination grace period (it stays terminating here)."""
        if grace is None:
            await self.core.delete_namespaced_pod(name, self.namespace)
        else:
            await self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace)
