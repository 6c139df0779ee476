"""Kubernetes discovery: one InferencePool (``inference.networking.k8s.io/v1``) and the Pods its selector matches.

Every target port of every Ready, non-terminating Pod with an IP becomes an endpoint ``<pod>-rank-<i>`` at
``podIP:port``, labelled with the Pod's labels; pool spec changes take effect live. Selector-only mode
(``pool_name=None`` with ``selector`` and ``target_ports``) needs no CRD. Every resource is followed with the
list/watch protocol of :mod:`epp.datalayer.k8s_watch`; a re-list replaces the datastore's endpoints (unchanged ones
keep their identity). :meth:`Datastore.mark_synced` is called once the pool was read and the first Pod list applied;
a missing or deleted pool keeps EPP unready. In pool mode the pool's ``InferenceObjective`` and
``InferenceModelRewrite`` resources are kept in ``datastore.objectives`` and ``datastore.rewrites``
(:mod:`epp.framework.objectives`); they do not gate readiness.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from epp.datalayer.datastore import Datastore
from epp.datalayer.k8s_objects import (
    ACTIVE_PORTS_ANNOTATION,
    POOL_GROUP,
    POOL_PLURAL,
    POOL_VERSION,
    POOL_VERSIONS,
    PoolSpec,
    parse_selector,
    pod_endpoints,
    pod_ready,
)
from epp.datalayer.k8s_watch import ListWatcher, Resource, WatchOptions
from epp.errors import ConfigError
from epp.framework.endpoint import EndpointSpec
from epp.framework.objectives import (
    OBJECTIVE_PLURAL,
    POLICY_GROUPS,
    POLICY_VERSION,
    REWRITE_PLURAL,
    parse_model_rewrite,
    parse_objective,
    pool_ref_matches,
)

__all__ = ["KubernetesDiscovery", "PoolSpec", "pod_endpoints", "pod_ready", "make_api_client", "POOL_GROUP",
           "POOL_VERSION", "POOL_PLURAL", "ACTIVE_PORTS_ANNOTATION", "WatchOptions", "parse_selector",
           "discovery_from_options"]

log = logging.getLogger(__name__)

async def make_api_client(kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> Any:
    """A ``kubernetes_asyncio`` ApiClient: in-cluster config inside a Pod (no ``kubeconfig`` given), else the
    kubeconfig file (``kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``). ``ConfigError`` if neither works."""
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            await config.load_kube_config(config_file=None if kubeconfig is None else str(kubeconfig),
                                          context=context, client_configuration=cfg)
    except (config.ConfigException, OSError, TypeError) as exc:
        raise ConfigError(f"cannot load Kubernetes client configuration: {exc}") from exc
    return client.ApiClient(configuration=cfg)


@dataclass(frozen=True)
class _Policy:
    """How one policy kind (InferenceObjective, InferenceModelRewrite) goes from its objects to the datastore:
    ``parse`` an object to ``(name, value)`` (``ValueError`` if unusable); ``publish`` the pool's current
    ``{name: value}``, merged over :data:`~epp.framework.objectives.POLICY_GROUPS`."""

    kind: str
    plural: str
    parse: Callable[[Mapping[str, Any]], tuple[str, Any]]
    publish: Callable[[dict[str, Any]], None]


def _named_rewrite(obj: Mapping[str, Any]) -> tuple[str, Any]:
    rewrite = parse_model_rewrite(obj)
    return rewrite.name, rewrite


def _policies(datastore: Datastore) -> list[_Policy]:
    objectives, rewrites = datastore.objectives, datastore.rewrites
    return [
        _Policy("InferenceObjective", OBJECTIVE_PLURAL, parse_objective, objectives.replace_all),
        _Policy("InferenceModelRewrite", REWRITE_PLURAL, _named_rewrite,
                lambda merged: rewrites.replace_all(list(merged.values()))),
    ]


class KubernetesDiscovery:
    """Keeps a :class:`Datastore` equal to the pool's endpoints (see the module docstring for the contract).

    Pool mode: ``pool_name`` (and ``namespace``). Selector-only mode: ``pool_name=None``, ``selector`` and
    ``target_ports``. ``api_client`` is a ``kubernetes_asyncio`` ApiClient; if omitted one is built at
    :meth:`start` from ``kubeconfig``/in-cluster config (and closed at :meth:`stop`).
    """

    def __init__(self, datastore: Datastore, *, namespace: str, pool_name: str | None = None,
                 selector: Mapping[str, str] | None = None, target_ports: list[int] | tuple[int, ...] | None = None,
                 api_client: Any = None, kubeconfig: str | os.PathLike[str] | None = None,
                 context: str | None = None, options: WatchOptions | None = None,
                 rng: random.Random | None = None, pool_group: str = POOL_GROUP,
                 metrics_port: int | None = None) -> None:
        if pool_name is None:
            if not selector or not target_ports:
                raise ConfigError("selector-only discovery needs both an endpoint selector and target ports")
            PoolSpec.from_object({"spec": {"selector": {"matchLabels": dict(selector)},
                                           "targetPorts": [{"number": p} for p in target_ports]}})
        if pool_group not in POOL_VERSIONS:
            raise ConfigError(f"unknown InferencePool group {pool_group!r} ({', '.join(POOL_VERSIONS)})",
                              field="pool-group")
        self.datastore = datastore
        self.namespace = namespace
        self.pool_name = pool_name
        self.pool_group = pool_group
        self.metrics_port = metrics_port
        self.options = options or WatchOptions()
        self._watcher = ListWatcher(self.options, rng or random.Random())
        # Selector-only mode: the one pool spec, never re-read.
        self._static_pool = (PoolSpec(dict(selector or {}), tuple(target_ports or ())) if pool_name is None
                             else None)
        self.pool: PoolSpec | None = self._static_pool
        self._api_client = api_client
        self._owns_client = api_client is None
        self._kubeconfig = kubeconfig
        self._context = context
        self._pods: dict[str, Mapping[str, Any]] = {}
        self._pod_endpoints: dict[str, list[str]] = {}
        self._pool_seen = False
        self._pods_listed = False
        self._pool_task: asyncio.Task[None] | None = None
        self._pods_task: asyncio.Task[None] | None = None
        self._policy_tasks: list[asyncio.Task[None]] = []
        self._policy_objects: dict[tuple[str, str], dict[str, Any]] = {}  # (plural, group) -> {name: parsed}

    async def start(self) -> None:
        """Build the client if needed and start watching (returns at once; readiness = datastore.synced)."""
        if self._api_client is None:
            self._api_client = await make_api_client(self._kubeconfig, self._context)
            self._owns_client = True
        loop = asyncio.get_running_loop()
        if self._static_pool is not None:
            self._pool_seen = True
            self._pods_task = loop.create_task(self._watch_pods(self._static_pool), name="k8s-pods")
        else:
            self._pool_task = loop.create_task(self._watch_pool(), name=f"k8s-pool:{self.pool_name}")
            self._policy_tasks = [loop.create_task(self._watch_policies(p, g), name=f"k8s-{p.plural}.{g}")
                                  for p in _policies(self.datastore) for g in POLICY_GROUPS]

    def resource_version(self, kind: str) -> str | None:
        """The last resourceVersion applied for ``kind`` (``Pod``, ``InferencePool``, or ``<Kind>.<group>`` for the
        policy kinds, e.g. ``InferenceObjective.llm-d.ai``); None before a list."""
        return self._watcher.resource_version(kind)

    @property
    def relists(self) -> int:
        """Re-lists after a 410 Gone, over every watched resource."""
        return self._watcher.relists

    @property
    def watches(self) -> int:
        """Watch requests made, over every watched resource."""
        return self._watcher.watches

    async def stop(self) -> None:
        """Stop watching and close the client if this discovery created it (the datastore keeps its state)."""
        tasks = [t for t in (self._pool_task, self._pods_task, *self._policy_tasks) if t is not None]
        self._pool_task = self._pods_task = None
        self._policy_tasks = []
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._owns_client and self._api_client is not None:
            await self._api_client.close()
            self._api_client = None

    # -- pool ------------------------------------------------------------------------------------------------

    async def _watch_pool(self) -> None:
        from kubernetes_asyncio import client

        api = client.CustomObjectsApi(self._api_client)

        def list_call(**kw: Any) -> Awaitable[Any]:
            return api.list_namespaced_custom_object(self.pool_group, POOL_VERSIONS[self.pool_group], self.namespace,
                                                     POOL_PLURAL, **kw)

        resource = Resource("InferencePool", list_call, {"field_selector": f"metadata.name={self.pool_name}"})
        await self._watcher.run(resource, self._on_pool_list, self._on_pool_event)

    def _on_pool_list(self, items: list[Mapping[str, Any]]) -> None:
        obj = next((i for i in items if (i.get("metadata") or {}).get("name") == self.pool_name), None)
        self._set_pool(obj)

    def _on_pool_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") != self.pool_name:
            return
        self._set_pool(None if kind == "DELETED" else obj)

    def _set_pool(self, obj: Mapping[str, Any] | None) -> None:
        spec: PoolSpec | None = None
        if obj is not None:
            try:
                spec = PoolSpec.from_object(obj)
            except ValueError as exc:
                self._watcher.error("pool-spec", f"InferencePool {self.namespace}/{self.pool_name} is unusable: {exc}")
            else:
                self._watcher.forget("pool-spec")
        self._pool_seen = True
        old, self.pool = self.pool, spec
        if spec is None:
            if old is not None or self._pods_task is not None:
                log.warning("InferencePool %s/%s is gone: no endpoints until it is back", self.namespace,
                            self.pool_name)
            self._stop_pod_watch()
            self._pods.clear()
            self._sync_all()
            self.datastore.mark_unsynced()  # as the reference's PoolHasSynced: no pool, not ready
            return
        if old is None or old.selector != spec.selector or self._pods_task is None:
            log.info("InferencePool %s/%s: selector %s, target ports %s", self.namespace, self.pool_name,
                     spec.label_selector(), list(spec.target_ports))
            self._stop_pod_watch()
            self._pods_listed = False
            self._pods_task = asyncio.get_running_loop().create_task(self._watch_pods(spec), name="k8s-pods")
        elif old.target_ports != spec.target_ports:
            log.info("InferencePool %s/%s: target ports now %s", self.namespace, self.pool_name,
                     list(spec.target_ports))
            self._sync_all()

    def _stop_pod_watch(self) -> None:
        if self._pods_task is not None:
            self._pods_task.cancel()
            self._pods_task = None

    # -- pods ------------------------------------------------------------------------------------------------

    async def _watch_pods(self, spec: PoolSpec) -> None:
        from kubernetes_asyncio import client

        api = client.CoreV1Api(self._api_client)

        def list_call(**kw: Any) -> Awaitable[Any]:
            return api.list_namespaced_pod(self.namespace, **kw)

        resource = Resource("Pod", list_call, {"label_selector": spec.label_selector()})
        await self._watcher.run(resource, self._on_pod_list, self._on_pod_event)

    def _on_pod_list(self, items: list[Mapping[str, Any]]) -> None:
        self._pods = {(p.get("metadata") or {}).get("name", ""): p for p in items}
        self._sync_all()
        self._pods_listed = True
        if self._pool_seen and not self.datastore.synced.is_set():
            log.info("Kubernetes discovery synced: %d endpoints", len(self.datastore.endpoints()))
            self.datastore.mark_synced()

    def _on_pod_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        name = (pod.get("metadata") or {}).get("name", "")
        if kind == "DELETED":
            self._pods.pop(name, None)
        else:
            self._pods[name] = pod
        self._sync_pod(name)

    def _sync_all(self) -> None:
        specs: list[EndpointSpec] = []
        self._pod_endpoints = {}
        if self.pool is not None:
            for name, pod in self._pods.items():
                eps = pod_endpoints(pod, self.pool, self.metrics_port)
                self._pod_endpoints[name] = [e.name for e in eps]
                specs += eps
        self.datastore.replace_all(specs)

    def _sync_pod(self, name: str) -> None:
        pod = self._pods.get(name)
        wanted = pod_endpoints(pod, self.pool, self.metrics_port) if pod is not None and self.pool is not None else []
        names = {e.name for e in wanted}
        for old in self._pod_endpoints.get(name, []):
            if old not in names:
                self.datastore.remove(old)
        for spec in wanted:
            self.datastore.upsert(spec)
        if wanted:
            self._pod_endpoints[name] = [e.name for e in wanted]
        else:
            self._pod_endpoints.pop(name, None)

    # -- objectives and model rewrites ----------------------------------------------------------------------

    async def _watch_policies(self, policy: _Policy, group: str) -> None:
        from kubernetes_asyncio import client

        api = client.CustomObjectsApi(self._api_client)

        def list_call(**kw: Any) -> Awaitable[Any]:
            return api.list_namespaced_custom_object(group, POLICY_VERSION, self.namespace, policy.plural, **kw)

        objects = self._policy_objects.setdefault((policy.plural, group), {})

        def on_list(items: list[Mapping[str, Any]]) -> None:
            objects.clear()
            objects.update(p for obj in items if self._ours(obj) and (p := self._parsed(policy, obj)) is not None)
            self._publish(policy)
            log.info("%ss of pool %s/%s in %s: %d", policy.kind, self.namespace, self.pool_name, group, len(objects))

        def on_event(kind: str, obj: Mapping[str, Any]) -> None:
            parsed = self._parsed(policy, obj) if kind != "DELETED" and self._ours(obj) else None
            if parsed is None:
                objects.pop((obj.get("metadata") or {}).get("name", ""), None)
            else:
                objects[parsed[0]] = parsed[1]
            self._publish(policy)

        await self._watcher.run(Resource(f"{policy.kind}.{group}", list_call, quiet_missing=True), on_list, on_event)

    def _ours(self, obj: Mapping[str, Any]) -> bool:
        """Whether a policy object applies to this pool now (names it, and is not being deleted)."""
        meta = obj.get("metadata") or {}
        return not meta.get("deletionTimestamp") and pool_ref_matches(obj, self.pool_name or "", self.pool_group)

    def _publish(self, policy: _Policy) -> None:
        """Hand the datastore the kind's objects of every group, the preferred group's winning a shared name."""
        merged: dict[str, Any] = {}
        for group in reversed(POLICY_GROUPS):
            merged.update(self._policy_objects.get((policy.plural, group), {}))
        policy.publish(merged)

    def _parsed(self, policy: _Policy, obj: Mapping[str, Any]) -> Any:
        """``policy.parse(obj)``, or None (logged once) when the object is unusable: it is then ignored."""
        key = f"{policy.kind}:{(obj.get('metadata') or {}).get('name', '')}"
        try:
            parsed = policy.parse(obj)
        except ValueError as exc:
            self._watcher.error(key, f"ignoring an unusable object in namespace {self.namespace}: {exc}")
            return None
        self._watcher.forget(key)
        return parsed


def discovery_from_options(datastore: Datastore, *, pool_name: str | None, namespace: str,
                           endpoint_selector: str | None = None, target_ports: list[int] | tuple[int, ...] = (),
                           kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None,
                           options: WatchOptions | None = None, pool_group: str = POOL_GROUP,
                           metrics_port: int | None = None) -> KubernetesDiscovery:
    """The discovery ``epp serve`` flags ask for: ``--pool-name`` (InferencePool) or ``--endpoint-selector`` with
    ``--endpoint-target-ports`` (selector-only). ``ConfigError`` if both or neither are given, or a value is invalid."""
    if (pool_name is None) == (endpoint_selector is None):
        raise ConfigError("give exactly one of an InferencePool name or an endpoint selector")
    if pool_name is not None:
        return KubernetesDiscovery(datastore, namespace=namespace, pool_name=pool_name, kubeconfig=kubeconfig,
                                   context=context, options=options, pool_group=pool_group,
                                   metrics_port=metrics_port)
    selector = parse_selector(endpoint_selector or "")
    if not target_ports:
        raise ConfigError("selector-only discovery needs target ports (--endpoint-target-ports)",
                          field="endpoint-target-ports")
    try:
        return KubernetesDiscovery(datastore, namespace=namespace, selector=selector, target_ports=list(target_ports),
                                   kubeconfig=kubeconfig, context=context, options=options,
                                   metrics_port=metrics_port)
    except ValueError as exc:
        raise ConfigError(f"invalid target ports {list(target_ports)}: {exc}",
                          field="endpoint-target-ports") from exc
