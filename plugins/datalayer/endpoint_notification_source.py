"""``endpoint-notification-source``: endpoint lifecycle events (added, updated, removed) for the plugins listed as its
extractors (llm-d's ``EndpointDataSource``; its extractor is the precise prefix-cache producer, which opens and
closes one KV-event subscriber per endpoint).

In EPP every plugin with background work sees the pool's changes directly (it subscribes to the datastore when it
starts), so this source carries no behaviour of its own: it exists so llm-d's configs load unchanged, and the loader
checks that each extractor listed under it consumes endpoint events. YAML::

    plugins:
    - type: endpoint-notification-source
    - type: precise-prefix-cache-producer
    dataLayer:
      sources:
      - pluginRef: endpoint-notification-source
        extractors: [{pluginRef: precise-prefix-cache-producer}]
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.plugins import Handle, NoParams

__all__ = ["EndpointNotificationSource"]


class EndpointNotificationSource:
    """A data source of endpoint lifecycle events (see the module doc)."""

    type_name: ClassVar[str] = "endpoint-notification-source"
    endpoint_events: ClassVar[bool] = True
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params
