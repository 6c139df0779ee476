"""``file-discovery``: endpoints from a YAML (or JSON) file, the endpoint source ``dataLayer.discovery`` names.

With it EPP needs no Kubernetes cluster. The file is EPP's endpoints file (:mod:`epp.datalayer.static`). It is read
when EPP starts (an invalid file stops the start); with ``watchFile: true`` it is read again when it changes (an
invalid version is logged and the previous set stays). A discovery plugin replaces the command line's endpoint
source (``--endpoints``, ``--pool-name``, ``--endpoint-selector``). YAML::

    plugins:
    - type: file-discovery
      parameters:
        path: /etc/epp/endpoints.yaml   # required
        watchFile: true                 # default false
    dataLayer:
      discovery:
        pluginRef: file-discovery       # v1alpha1; v1 writes discovery: {endpoints: {pluginRef: file-discovery}}
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from epp.datalayer.static import StaticFileDiscovery
from epp.framework.plugins import Handle
from epp.framework.plugins import Params as PluginParams
from epp.framework.pool import EndpointDiscovery, EndpointStore

__all__ = ["FileDiscovery"]


class FileDiscovery:
    """Endpoint discovery from a file: :meth:`discovery_service` is the service that keeps the pool's endpoint
    store equal to the file's endpoints (see the module docstring)."""

    type_name: ClassVar[str] = "file-discovery"

    class Params(PluginParams):
        path: str = Field(min_length=1)
        watch_file: bool = Field(False, alias="watchFile")

    def __init__(self, name: str, params: Params, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params

    def discovery_service(self, store: EndpointStore) -> StaticFileDiscovery:
        """A (not yet started) service filling ``store`` from the file: ``await start()`` loads it (a
        ``ConfigError`` if it is invalid), ``await stop()`` stops watching it."""
        return StaticFileDiscovery(self.params.path, store, watch=self.params.watch_file)


_check: type[EndpointDiscovery] = FileDiscovery
