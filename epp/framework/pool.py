"""What plugins see of the pool's endpoint set: a read view, the discovery side that writes it, and services.

:class:`EndpointPool` is what a :class:`~epp.framework.plugins.PluginService` gets when EPP starts it: the live
endpoints, look-up by name, and ``(added, removed)`` change notifications. :class:`EndpointStore` adds what an
endpoint discovery source writes (the whole set, one endpoint, synced state, and the pool's objectives and model
rewrites). An :class:`EndpointDiscovery` plugin (``dataLayer.discovery``) returns a :class:`Service` that keeps an
:class:`EndpointStore` current. The engine's datastore satisfies both Protocols structurally; plugins never import
it. Change listeners run synchronously inside the change, on the event loop: they must not block.
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol, runtime_checkable

from epp.framework.endpoint import Endpoint, EndpointSpec
from epp.framework.objectives import ModelRewrites, Objectives

__all__ = ["ChangeListener", "EndpointPool", "EndpointStore", "Service", "EndpointDiscovery"]

ChangeListener = Callable[[list[Endpoint], list[Endpoint]], None]
"""``listener(added, removed)``, called after every change of the endpoint set."""


class EndpointPool(Protocol):
    """The pool's live endpoints, read-only (the Director and plugin services read it)."""

    def endpoints(self) -> list[Endpoint]:
        """All endpoints, in a stable order. Do not mutate the returned list."""
        ...

    def get(self, name: str) -> Endpoint | None:
        """The endpoint called ``name``, or None."""
        ...

    def subscribe(self, listener: ChangeListener) -> None:
        """Call ``listener(added, removed)`` after every change."""
        ...


class EndpointStore(EndpointPool, Protocol):
    """What an endpoint discovery source writes: endpoints (keeping the identity of unchanged ones), whether a
    full sync happened (readiness), and the pool's InferenceObjectives and InferenceModelRewrites."""

    @property
    def objectives(self) -> Objectives: ...

    @property
    def rewrites(self) -> ModelRewrites: ...

    def upsert(self, spec: EndpointSpec) -> Endpoint:
        """Add or update one endpoint; an address/port change replaces it (new identity)."""
        ...

    def remove(self, name: str) -> None:
        """Remove one endpoint if present."""
        ...

    def replace_all(self, specs: Iterable[EndpointSpec]) -> None:
        """Make the set of endpoints exactly ``specs`` (names must be unique), keeping unchanged ones."""
        ...

    def mark_synced(self) -> None:
        """Discovery finished a full sync (readiness waits for this)."""
        ...

    def mark_unsynced(self) -> None:
        """Discovery lost what it serves: not ready until :meth:`mark_synced`."""
        ...


class Service(Protocol):
    """Background work with a start and an idempotent stop."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class EndpointDiscovery(Protocol):
    """A plugin that is the pool's endpoint source (``dataLayer.discovery``), replacing the command line's."""

    def discovery_service(self, store: EndpointStore) -> Service:
        """A service, not yet started, that keeps ``store`` equal to the endpoints it discovers: ``await
        start()`` does the first full sync (and marks ``store`` synced) or raises ``ConfigError``."""
        ...
