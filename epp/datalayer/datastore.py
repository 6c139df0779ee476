"""The Datastore: discovery writes endpoints into it, scheduling and scraping read from it.

Discovery sources (static file, Kubernetes) call :meth:`Datastore.replace_all`, :meth:`upsert` and
:meth:`remove`. Subscribers (the metrics scraper, stateful plugins) get ``(added, removed)`` callbacks. An endpoint
object keeps its identity (and in-flight counters) across an upsert that only changes labels, so in-flight
requests are never lost on a reload. Plugins see it only through the framework's
:class:`~epp.framework.pool.EndpointPool` and :class:`~epp.framework.pool.EndpointStore`, which it satisfies.
"""

from __future__ import annotations

import asyncio
from typing import Iterable

from epp.framework.endpoint import Endpoint, EndpointSpec
from epp.framework.objectives import ModelRewrites, Objectives
from epp.framework.pool import ChangeListener, EndpointStore

__all__ = ["Datastore", "ChangeListener"]


class Datastore:
    """Holds the pool's endpoints by name; ``endpoints()`` and ``by_hostport()`` read indexes rebuilt on change.

    ``objectives`` and ``rewrites`` hold the pool's InferenceObjectives and InferenceModelRewrites
    (:mod:`epp.framework.objectives`), which discovery keeps current and the Director reads per request.
    """

    def __init__(self, pool_name: str = "default-pool") -> None:
        self.pool_name = pool_name
        self._by_name: dict[str, Endpoint] = {}
        self._by_hostport: dict[str, Endpoint] = {}
        self._list: list[Endpoint] = []
        self._listeners: list[ChangeListener] = []
        self.synced = asyncio.Event()
        self._sync_change = asyncio.Event()
        self.objectives = Objectives()
        self.rewrites = ModelRewrites()

    def endpoints(self) -> list[Endpoint]:
        """All endpoints, in a stable order. Do not mutate the returned list."""
        return self._list

    def get(self, name: str) -> Endpoint | None:
        """The endpoint called ``name``, or None."""
        return self._by_name.get(name)

    def by_hostport(self, hostport: str) -> Endpoint | None:
        """The endpoint at ``address:port``, or None."""
        return self._by_hostport.get(hostport)

    def subscribe(self, listener: ChangeListener) -> None:
        """Call ``listener(added, removed)`` after every change."""
        self._listeners.append(listener)

    def upsert(self, spec: EndpointSpec) -> Endpoint:
        """Add or update one endpoint; an address/port change replaces it (new identity)."""
        added, removed = self._apply_upsert(spec)
        self._changed(added, removed)
        return self._by_name[spec.name]

    def remove(self, name: str) -> None:
        """Remove one endpoint if present."""
        ep = self._by_name.pop(name, None)
        if ep is not None:
            self._changed([], [ep])

    def replace_all(self, specs: Iterable[EndpointSpec]) -> None:
        """Make the set of endpoints exactly ``specs`` (names must be unique), keeping unchanged ones."""
        specs = list(specs)
        wanted = {s.name for s in specs}
        added: list[Endpoint] = []
        removed = [ep for name, ep in self._by_name.items() if name not in wanted]
        for ep in removed:
            del self._by_name[ep.name]
        for spec in specs:
            a, r = self._apply_upsert(spec)
            added += a
            removed += r
        self._changed(added, removed)

    def mark_synced(self) -> None:
        """Discovery finished a full sync (readiness waits for this)."""
        if not self.synced.is_set():
            self.synced.set()
            self._sync_changed()

    def mark_unsynced(self) -> None:
        """Discovery lost what it serves (the InferencePool was deleted): not ready until :meth:`mark_synced`."""
        if self.synced.is_set():
            self.synced.clear()
            self._sync_changed()

    async def sync_changed(self) -> None:
        """Return at the next :meth:`mark_synced` or :meth:`mark_unsynced` that changes :attr:`synced`."""
        await self._sync_change.wait()

    def _sync_changed(self) -> None:
        self._sync_change.set()
        self._sync_change = asyncio.Event()  # later waiters wait for the next change

    def _apply_upsert(self, spec: EndpointSpec) -> tuple[list[Endpoint], list[Endpoint]]:
        old = self._by_name.get(spec.name)
        if old is not None and old.spec == spec:
            return [], []
        if old is not None and old.hostport == spec.hostport:
            self._retag(old, spec)
            return [], []
        new = Endpoint(spec)
        self._by_name[spec.name] = new
        return [new], ([old] if old is not None else [])

    @staticmethod
    def _retag(ep: Endpoint, spec: EndpointSpec) -> None:
        ep.spec = spec
        ep.labels = spec.labels

    def _changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        self._list = list(self._by_name.values())
        # Rebuilt, not patched: when endpoints swap addresses (targetPorts reordered) an old address may
        # already belong to another endpoint, and deleting it would hide that live endpoint.
        self._by_hostport = {ep.hostport: ep for ep in self._list}
        if added or removed:
            for listener in self._listeners:
                listener(added, removed)


_conforms: type[EndpointStore] = Datastore  # mypy checks that the datastore is what plugins are given
