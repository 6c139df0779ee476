"""A Kubernetes API server stand-in on 127.0.0.1 that speaks the real REST and watch protocol.

Serves what EPP's discovery, its leader election and the tests' cluster driver use, for ``pods`` (core/v1),
``inferencepools`` (``inference.networking.k8s.io/v1``), ``inferenceobjectives`` and ``inferencemodelrewrites`` (in
both ``inference.networking.x-k8s.io/v1alpha2`` and ``llm-d.ai/v1alpha2``; the store calls the latter
``inferenceobjectives.llm-d.ai`` and ``inferencemodelrewrites.llm-d.ai``), the older v1alpha2 InferencePool
(``inference.networking.x-k8s.io/v1alpha2``, stored as ``inferencepools.x-k8s.io``) and ``leases``
(``coordination.k8s.io/v1``): namespaced list / watch / get / create / replace / merge-patch / delete, the
``status`` subresource (not for leases, which have none), namespaces (create / get / delete), equality and
existence label selectors, ``metadata.name`` field selectors, and one global ``resourceVersion`` counter as etcd
keeps it. A replace carrying a stale ``metadata.resourceVersion`` gets ``409 Conflict``, a create of an existing
name ``409 AlreadyExists``; as for the real Lease, a lease replace without a resourceVersion is refused (422:
no unconditional updates), and ``spec.leaseDurationSeconds`` (> 0), ``spec.leaseTransitions`` (>= 0) and the
MicroTime fields ``acquireTime`` / ``renewTime`` (RFC 3339 with exactly six fractional digits, 400 otherwise)
are checked.

Watches are newline-delimited JSON events over a chunked response, as the API server sends them:

- ``resourceVersion`` unset or ``0``: synthetic ``ADDED`` events for the current objects, then live events;
  ``resourceVersion=N``: every change after N from the history, then live events;
- label-selector transitions as the real watch cache reports them (an object that stops matching is
  ``DELETED``, one that starts matching is ``ADDED``);
- ``410 Gone`` for a resourceVersion older than the compaction point, as an ``ERROR`` event with a ``Status``
  object (what API servers do) or, with ``gone_as_http=True``, as an HTTP 410 response;
- ``BOOKMARK`` events every ``bookmark_interval`` seconds when the client asks with ``allowWatchBookmarks``;
- server-side ``timeoutSeconds`` (capped by ``watch_timeout_max``): the stream ends cleanly.

Fault injection: ``missing`` (the plurals whose CRD is "not installed": 404 until removed from the set),
``delay`` (``{(verb, plural): seconds}``: such requests are answered that much later, the store acting only then,
as a slow API server; verbs as in ``requests``),
:meth:`compact` (expire history), :meth:`cut_next_event` (the next event is written half-way
and the connection aborted), :meth:`drop_watches`, :meth:`stop` / :meth:`start` (API server down / restarted).

Deliberate simplifications, none of which EPP depends on: strategic-merge patches are applied as JSON merge
patches (lists are replaced, so clients send whole lists), no RBAC/admission, pods never get scheduled. Created
InferencePools are checked against the CRD's main OpenAPI constraints (v1: selector and targetPorts; v1alpha2:
selector, targetPortNumber, extensionRef); its CEL rules are not evaluated. InferenceObjectives and
InferenceModelRewrites get their CRDs' defaults (``poolRef.group``/``kind``, ``matches[].model.type``) and main
constraints (required fields, weight range). Those object rules live in :mod:`fake_kube_schema`.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from .fake_kube_schema import (
    KINDS,
    LEASE_API,
    LLMD_API,
    POLICY_PLURALS,
    POOL_API,
    X_API,
    HttpError,
    default_and_validate_policy,
    label_match,
    merge_patch,
    now_rfc3339,
    parse_label_selector,
    status_object,
    validate_lease,
    validate_pool,
)


@dataclass
class Change:
    rv: int
    plural: str
    namespace: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None



class FakeKube:
    """The fake API server (see the module docstring). ``requests`` counts ``(verb, plural)`` calls (verbs
    ``list``, ``watch``, ``create``, ``get``, ``update``, ``patch``, ``delete``); ``conflicts`` counts the 409
    answers per plural; ``last_bookmark_rv`` is the resourceVersion carried by the latest BOOKMARK sent."""

    def __init__(self, *, bookmark_interval: float | None = 0.1, watch_timeout_max: float | None = None,
                 gone_as_http: bool = False) -> None:
        self.bookmark_interval = bookmark_interval
        self.watch_timeout_max = watch_timeout_max
        self.gone_as_http = gone_as_http
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.history: list[Change] = []
        self.compacted_rv = 0
        self.requests: Counter[tuple[str, str]] = Counter()
        self.conflicts: Counter[str] = Counter()
        self.delay: dict[tuple[str, str], float] = {}
        self.last_bookmark_rv = 0
        self.port = 0
        self._rv = itertools.count(100)
        self.rv = next(self._rv)
        self._watchers: set[asyncio.Queue[Change | None]] = set()
        self._runner: web.AppRunner | None = None
        self._cut_next = False
        self.missing: set[str] = set()
        self.route_hooks: list[Callable[[web.UrlDispatcher], None]] = []
        """Add more API routes (e.g. ``fake_kube_auth.AuthReviews``) when the server starts."""
        self.add_namespace("default")

    # -- lifecycle -------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self, port: int | None = None) -> None:
        """Listen on 127.0.0.1 (``port``, else the previous port, else a free one)."""
        app = web.Application()
        for prefix in ("/api/v1", f"/apis/{POOL_API}", f"/apis/{X_API}", f"/apis/{LLMD_API}", f"/apis/{LEASE_API}"):
            app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}", self._collection)
            app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}/{name}", self._item)
            app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}/{name}/{sub}", self._item)
        app.router.add_route("*", "/api/v1/namespaces", self._namespaces)
        app.router.add_route("*", "/api/v1/namespaces/{name}", self._namespace)
        for add_routes in self.route_hooks:
            add_routes(app.router)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port if port is None else port, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Stop serving: open watch streams are cut, new connections refused."""
        for q in list(self._watchers):
            q.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """Write a kubeconfig pointing at this server (plain HTTP, a dummy token)."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
        }))
        return path

    # -- fault injection -------------------------------------------------------------------------------------

    def compact(self) -> None:
        """Expire every resourceVersion older than the current one: watches resuming from them get 410 Gone."""
        self.compacted_rv = self.rv
        self.history.clear()

    def cut_next_event(self) -> None:
        """Write only the first half of the next watch event, then abort the connection."""
        self._cut_next = True

    def drop_watches(self) -> None:
        """Close every open watch stream now (between events), as a load balancer dropping connections."""
        for q in list(self._watchers):
            q.put_nowait(None)

    # -- object store (used by the HTTP handlers; fake-only tests may call it directly) --------------------------

    def add_namespace(self, name: str) -> dict[str, Any]:
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "uid": str(uuid.uuid4())},
              "status": {"phase": "Active"}}
        self.namespaces.setdefault(name, ns)
        return self.namespaces[name]

    def create(self, plural: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        if ns not in self.namespaces:
            raise HttpError(404, "NotFound", f'namespaces "{ns}" not found')
        obj = copy.deepcopy(obj)
        kind = KINDS[plural]
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            raise HttpError(422, "Invalid", f"{kind.kind}: metadata.name: Required value")
        if (plural, ns, name) in self.objects:
            raise HttpError(409, "AlreadyExists", f'{plural} "{name}" already exists')
        obj["kind"], obj["apiVersion"] = kind.kind, kind.api_version
        if plural == "pods":
            if not (obj.get("spec") or {}).get("containers"):
                raise HttpError(422, "Invalid", f'Pod "{name}" is invalid: spec.containers: Required value')
            obj["status"] = {"phase": "Pending"}  # the API server ignores status on create
        elif plural == "leases":
            validate_lease(obj)
        else:
            if plural in POLICY_PLURALS:
                default_and_validate_policy(plural, obj)
            else:
                validate_pool(obj)
            obj.pop("status", None)
            meta["generation"] = 1
        meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
        self._commit(plural, ns, None, obj)
        return obj

    def get(self, plural: str, ns: str, name: str) -> dict[str, Any]:
        obj = self.objects.get((plural, ns, name))
        if obj is None:
            raise HttpError(404, "NotFound", f'{plural} "{name}" not found')
        return obj

    def update(self, plural: str, ns: str, name: str, obj: dict[str, Any], *, subresource: str | None = None,
               expect_rv: str | None = None) -> dict[str, Any]:
        old = self.get(plural, ns, name)
        if expect_rv and expect_rv != old["metadata"]["resourceVersion"]:
            raise HttpError(409, "Conflict", f'Operation cannot be fulfilled on {plural} "{name}": the object has '
                                             f"been modified; please apply your changes to the latest version")
        new = copy.deepcopy(old)
        if subresource == "status":
            new["status"] = copy.deepcopy(obj.get("status") or {})
        else:
            keep = {k: old["metadata"][k] for k in ("uid", "creationTimestamp", "namespace", "name",
                                                     "deletionTimestamp", "generation") if k in old["metadata"]}
            new_meta = copy.deepcopy(obj.get("metadata") or {})
            new_meta.update(keep)
            new["metadata"] = new_meta
            new["spec"] = copy.deepcopy(obj.get("spec", old.get("spec")))
            if plural in POLICY_PLURALS:
                default_and_validate_policy(plural, new)
            if plural == "leases":
                validate_lease(new)
            elif plural != "pods":
                if plural.startswith("inferencepools"):
                    validate_pool(new)
                if new["spec"] != old.get("spec"):
                    new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if new == old:
            return old  # a no-op update does not bump the resourceVersion
        self._commit(plural, ns, old, new)
        return new

    def patch(self, plural: str, ns: str, name: str, patch: dict[str, Any], *,
              subresource: str | None = None) -> dict[str, Any]:
        merged = merge_patch(self.get(plural, ns, name), patch)
        return self.update(plural, ns, name, merged, subresource=subresource)

    def delete(self, plural: str, ns: str, name: str, grace: int | None = None) -> dict[str, Any]:
        old = self.get(plural, ns, name)
        bound = plural == "pods" and (old.get("spec") or {}).get("nodeName")
        if bound and grace != 0 and not old["metadata"].get("deletionTimestamp"):
            # A pod on a node terminates gracefully: it gets a deletionTimestamp and stays until the kubelet
            # (absent here) confirms, or until a delete with gracePeriodSeconds=0.
            new = copy.deepcopy(old)
            period = grace if grace is not None else (old.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            new["metadata"].update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=period)
            self._commit(plural, ns, old, new)
            return new
        self._commit(plural, ns, old, None)
        return old

    def _commit(self, plural: str, ns: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self.rv = next(self._rv)
        name = (new or old)["metadata"]["name"]  # type: ignore[index]
        if new is None:
            del self.objects[(plural, ns, name)]
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self.rv)  # type: ignore[index]
            change = Change(self.rv, plural, ns, gone, None)
        else:
            new["metadata"]["resourceVersion"] = str(self.rv)
            self.objects[(plural, ns, name)] = new
            change = Change(self.rv, plural, ns, old, new)
        self.history.append(change)
        for q in list(self._watchers):
            q.put_nowait(change)

    # -- HTTP ------------------------------------------------------------------------------------------------

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        ns, plural = request.match_info["ns"], self._plural(request)
        watch = request.query.get("watch") in ("true", "1", "True")
        verb = {"GET": "watch" if watch else "list", "POST": "create"}.get(request.method)
        if verb is not None:
            self.requests[(verb, plural)] += 1  # counted even when answered 404 (a CRD not installed)
            await self._slow(verb, plural)
        try:
            self._check_kind(request, plural)
            if verb == "watch":
                return await self._watch(request, plural, ns)
            if verb == "list":
                return web.json_response(self._list(request, plural, ns))
            if verb == "create":
                return web.json_response(self.create(plural, ns, await request.json()), status=201)
            raise HttpError(405, "MethodNotAllowed", f"{request.method} not allowed")
        except HttpError as exc:
            return self._refuse(plural, exc)

    async def _item(self, request: web.Request) -> web.StreamResponse:
        ns, plural, name = request.match_info["ns"], self._plural(request), request.match_info["name"]
        sub = request.match_info.get("sub")
        verb = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(request.method)
        if verb is not None:
            self.requests[(verb, plural)] += 1
            await self._slow(verb, plural)
        try:
            self._check_kind(request, plural)
            if sub is not None and (sub != "status" or not KINDS[plural].status):
                raise HttpError(404, "NotFound", f"subresource {sub} not served for {plural}")
            if request.method == "GET":
                return web.json_response(self.get(plural, ns, name))
            if request.method == "PUT":
                body = await request.json()
                expect = (body.get("metadata") or {}).get("resourceVersion")
                if plural == "leases" and not expect:  # the Lease strategy allows no unconditional update
                    raise HttpError(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: '
                                    "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update")
                return web.json_response(self.update(plural, ns, name, body, subresource=sub, expect_rv=expect))
            if request.method == "PATCH":
                ctype = request.headers.get("Content-Type", "")
                if "merge-patch" not in ctype:
                    raise HttpError(415, "UnsupportedMediaType", f"the fake applies merge patches only, not {ctype}")
                return web.json_response(self.patch(plural, ns, name, await request.json(), subresource=sub))
            if request.method == "DELETE":
                grace = request.query.get("gracePeriodSeconds")
                if grace is None and request.can_read_body:
                    grace = (await request.json() or {}).get("gracePeriodSeconds")
                return web.json_response(self.delete(plural, ns, name, None if grace is None else int(grace)))
            raise HttpError(405, "MethodNotAllowed", f"{request.method} not allowed")
        except HttpError as exc:
            return self._refuse(plural, exc)

    async def _slow(self, verb: str, plural: str) -> None:
        delay = self.delay.get((verb, plural))
        if delay:
            await asyncio.sleep(delay)

    def _refuse(self, plural: str, exc: HttpError) -> web.Response:
        if exc.status == 409:
            self.conflicts[plural] += 1
        return exc.response()

    async def _namespaces(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            return HttpError(405, "MethodNotAllowed", "only POST").response()
        name = ((await request.json()).get("metadata") or {}).get("name")
        if name in self.namespaces:
            return HttpError(409, "AlreadyExists", f'namespaces "{name}" already exists').response()
        return web.json_response(self.add_namespace(name), status=201)

    async def _namespace(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.namespaces:
            return HttpError(404, "NotFound", f'namespaces "{name}" not found').response()
        if request.method == "DELETE":
            for key in [k for k in self.objects if k[1] == name]:
                self._commit(key[0], name, self.objects[key], None)
            return web.json_response(self.namespaces.pop(name))
        return web.json_response(self.namespaces[name])

    @staticmethod
    def _plural(request: web.Request) -> str:
        """The store's name for the resource of ``request`` (``<plural>.llm-d.ai`` under ``/apis/llm-d.ai/``)."""
        plural = request.match_info["plural"]
        if request.path.startswith(f"/apis/{LLMD_API}/"):
            return f"{plural}.llm-d.ai"
        if plural == "inferencepools" and request.path.startswith(f"/apis/{X_API}/"):
            return "inferencepools.x-k8s.io"  # the v1alpha2 InferencePool
        return plural

    def _check_kind(self, request: web.Request, plural: str) -> None:
        kind = KINDS.get(plural)
        prefix = "/api/v1/" if kind is None or kind.api_version == "v1" else f"/apis/{kind.api_version}/"
        if kind is None or plural in self.missing or not request.path.startswith(prefix):
            raise HttpError(404, "NotFound", f"the server could not find the requested resource ({plural})")

    def _filter(self, request: web.Request) -> tuple[list[tuple[str, str, str | None]], str | None]:
        terms = parse_label_selector(request.query.get("labelSelector", ""))
        name = None
        for term in filter(None, request.query.get("fieldSelector", "").split(",")):
            key, _, value = term.partition("=")
            if key == "metadata.name":
                name = value
            elif key != "metadata.namespace":
                raise HttpError(400, "BadRequest", f'field label not supported: "{key}"')
        return terms, name

    def _selected(self, obj: dict[str, Any] | None, terms: list, name: str | None) -> bool:
        if obj is None:
            return False
        meta = obj["metadata"]
        return (name is None or meta["name"] == name) and label_match(terms, meta.get("labels") or {})

    def _list(self, request: web.Request, plural: str, ns: str) -> dict[str, Any]:
        terms, name = self._filter(request)
        items = [o for (p, n, _), o in sorted(self.objects.items()) if p == plural and n == ns
                 and self._selected(o, terms, name)]
        kind = KINDS[plural]
        return {"kind": kind.kind + "List", "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(self.rv)}, "items": items}

    async def _watch(self, request: web.Request, plural: str, ns: str) -> web.StreamResponse:
        terms, name = self._filter(request)
        rv_param = request.query.get("resourceVersion", "")
        bookmarks = request.query.get("allowWatchBookmarks") in ("true", "1", "True")
        timeout = float(request.query.get("timeoutSeconds", 1800))
        if self.watch_timeout_max is not None:
            timeout = min(timeout, self.watch_timeout_max)
        expired = rv_param not in ("", "0") and int(rv_param) < self.compacted_rv
        if expired and self.gone_as_http:
            return HttpError(410, "Expired", f"too old resource version: {rv_param} ({self.compacted_rv})").response()
        queue: asyncio.Queue[Change | None] = asyncio.Queue()
        self._watchers.add(queue)  # registered before the backlog is computed: no event can fall in between
        try:
            if rv_param in ("", "0"):
                backlog = [Change(int(o["metadata"]["resourceVersion"]), plural, ns, None, o)
                           for (p, n, _), o in sorted(self.objects.items()) if p == plural and n == ns]
            elif not expired:
                backlog = [c for c in self.history if c.rv > int(rv_param)]
            else:
                backlog = []
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            if expired:
                gone = status_object(410, "Expired", f"too old resource version: {rv_param} ({self.compacted_rv})")
                await resp.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                return resp
            for change in backlog:
                queue.put_nowait(change)
            await self._stream(request, resp, queue, plural, ns, terms, name, bookmarks, timeout)
            return resp
        finally:
            self._watchers.discard(queue)

    async def _stream(self, request: web.Request, resp: web.StreamResponse, queue: asyncio.Queue[Change | None],
                      plural: str, ns: str, terms: list, name: str | None, bookmarks: bool, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        kind = KINDS[plural]
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return  # server-side timeout: end the stream cleanly
            wait = remaining if not (bookmarks and self.bookmark_interval) else min(remaining, self.bookmark_interval)
            try:
                change = await asyncio.wait_for(queue.get(), wait)
            except asyncio.TimeoutError:
                if bookmarks and self.bookmark_interval and time.monotonic() < deadline:
                    mark = {"kind": kind.kind, "apiVersion": kind.api_version,
                            "metadata": {"resourceVersion": str(self.rv)}}
                    await resp.write(json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")
                    self.last_bookmark_rv = self.rv
                continue
            if change is None:
                assert request.transport is not None
                request.transport.abort()  # dropped connection: no terminating chunk
                return
            event = self._event(change, plural, ns, terms, name)
            if event is None:
                continue
            line = json.dumps(event).encode() + b"\n"
            if self._cut_next:
                self._cut_next = False
                await resp.write(line[: len(line) // 2])
                assert request.transport is not None
                request.transport.abort()
                return
            await resp.write(line)

    def _event(self, change: Change, plural: str, ns: str, terms: list, name: str | None) -> dict[str, Any] | None:
        if change.plural != plural or change.namespace != ns:
            return None
        was, now = self._selected(change.old, terms, name), self._selected(change.new, terms, name)
        if change.new is None:
            return {"type": "DELETED", "object": change.old} if was else None
        if now and not was:
            return {"type": "ADDED", "object": change.new}
        if now and was:
            return {"type": "MODIFIED", "object": change.new}
        if was and not now:
            return {"type": "DELETED", "object": change.new}
        return None
